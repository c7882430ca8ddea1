// Every reason a capture can stop, with a stable id. Tests, the report and the docs refer to
// these ids; never renumber one, only add.
#pragma once

namespace magpy::breaks {

constexpr const char* kDataDependentBranch = "MB001";   // if/while on a tensor's values, or on a
                                                         // number read from one or drawn by random;
                                                         // on a data-dependent size once its guess
                                                         // failed, or after a visible effect
constexpr const char* kTensorToPython = "MB002";        // .item(), bool(t), int(t), .tolist()
constexpr const char* kUnsupportedCallee = "MB003";     // a function with no rule
constexpr const char* kUnsupportedOpcode = "MB004";     // a bytecode construct not handled yet
constexpr const char* kIO = "MB005";                    // print, input, files, logging
constexpr const char* kException = "MB006";             // an exception raised inside the capture
constexpr const char* kUnsupportedAttribute = "MB007";  // property, __getattr__, tensor attribute
constexpr const char* kMutatedThenRead = "MB008";       // a caller's container read after a write
constexpr const char* kEscapingObject = "MB009";        // an object we cannot rebuild escapes
constexpr const char* kDynamicShape = "MB010";          // strides of a mask result, or a loop over
                                                         // one whose guessed length changed
constexpr const char* kNoPythonCode = "MB011";          // compile() of a callable with no Python code
constexpr const char* kTracerActive = "MB012";          // another tracer (debugger, coverage) is on
constexpr const char* kCacheLimit = "MB013";            // recompiled too often; running eagerly
constexpr const char* kTryAfterEffect = "MB014";        // an op in try after a visible write
constexpr const char* kTooLarge = "MB015";              // the call records too many steps
constexpr const char* kGeneratorCleanup = "MB016";      // a generator left inside its own try or
                                                         // with block (its cleanup runs there);
                                                         // the whole call runs eagerly
constexpr const char* kInternal = "MB099";              // an engine bug; the call ran eagerly

}  // namespace magpy::breaks
