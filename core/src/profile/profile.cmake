# The kernel profiler (see [Note: CUPTI profiler] in core/NOTES.md), included at the end of
# core/CMakeLists.txt. It adds to magpy_core either cupti_profiler.cpp, linked to CUPTI and with
# MAGPY_HAS_CUPTI defined, or null_profiler.cpp where CUPTI is not found (or
# -DMAGPY_WITH_CUPTI=OFF). CUPTI is looked for as CUDAToolkit's CUDA::cupti first, then by
# hand: a toolkit without nvcc (CUDAToolkit_ROOT, CUDA_HOME, CUDA_PATH, /usr/local/cuda) or the
# nvidia-cuda-cupti wheel next to the interpreter's torch. The driver (libcuda) is never linked:
# the profiler opens it at run time, so magpy loads on machines without a GPU.
option(MAGPY_WITH_CUPTI "Build the CUPTI kernel profiler when CUPTI is found" ON)

set(_magpy_profile_dir "${CMAKE_CURRENT_LIST_DIR}")
target_sources(magpy_core PRIVATE "${_magpy_profile_dir}/profiler.cpp")

set(_magpy_cupti_link "")
set(_magpy_cupti_includes "")
if(MAGPY_WITH_CUPTI)
    find_package(CUDAToolkit QUIET)
    if(TARGET CUDA::cupti)
        set(_magpy_cupti_link CUDA::cupti)
        get_target_property(_magpy_cupti_where CUDA::cupti IMPORTED_LOCATION)
        set(_magpy_cupti_includes ${CUDAToolkit_INCLUDE_DIRS})
    else()
        set(_magpy_cupti_hints "")
        foreach(_root "${CUDAToolkit_ROOT}" "$ENV{CUDAToolkit_ROOT}" "$ENV{CUDA_HOME}"
                      "$ENV{CUDA_PATH}" /usr/local/cuda)
            if(_root)
                list(APPEND _magpy_cupti_hints "${_root}" "${_root}/extras/CUPTI")
            endif()
        endforeach()
        # pip's CUDA wheels: site-packages/nvidia/<cu13|cuda_cupti|cuda_runtime|...>/{include,lib}
        execute_process(
            COMMAND "${Python3_EXECUTABLE}" -c
                    "import os, nvidia; print(';'.join(os.path.join(p, d) for p in nvidia.__path__ for d in sorted(os.listdir(p))), end='')"
            RESULT_VARIABLE _magpy_nvidia_rc OUTPUT_VARIABLE _magpy_nvidia_dirs ERROR_QUIET)
        if(_magpy_nvidia_rc EQUAL 0)
            list(APPEND _magpy_cupti_hints ${_magpy_nvidia_dirs})
        endif()
        find_path(MAGPY_CUPTI_INCLUDE_DIR cupti.h HINTS ${_magpy_cupti_hints}
                  PATH_SUFFIXES include)
        find_path(MAGPY_CUDA_INCLUDE_DIR cuda.h HINTS ${_magpy_cupti_hints}
                  PATH_SUFFIXES include)
        find_library(MAGPY_CUPTI_LIBRARY NAMES cupti libcupti.so.13 libcupti.so.12
                     HINTS ${_magpy_cupti_hints} PATH_SUFFIXES lib64 lib)
        if(MAGPY_CUPTI_INCLUDE_DIR AND MAGPY_CUDA_INCLUDE_DIR AND MAGPY_CUPTI_LIBRARY)
            set(_magpy_cupti_link "${MAGPY_CUPTI_LIBRARY}")
            set(_magpy_cupti_where "${MAGPY_CUPTI_LIBRARY}")
            set(_magpy_cupti_includes "${MAGPY_CUPTI_INCLUDE_DIR}" "${MAGPY_CUDA_INCLUDE_DIR}")
        endif()
    endif()
endif()

# For tests/gpu/cupti_check.cu (built by tests/CMakeLists.txt with nvcc where it is found).
set(MAGPY_CUPTI_LIBRARY_FILE "${_magpy_cupti_where}" CACHE INTERNAL "")
set(MAGPY_CUPTI_INCLUDES "${_magpy_cupti_includes}" CACHE INTERNAL "")
if(_magpy_cupti_link)
    target_sources(magpy_core PRIVATE "${_magpy_profile_dir}/cupti_profiler.cpp")
    target_include_directories(magpy_core SYSTEM PRIVATE ${_magpy_cupti_includes})
    target_link_libraries(magpy_core PRIVATE ${_magpy_cupti_link} ${CMAKE_DL_LIBS})
    target_compile_definitions(magpy_core PUBLIC MAGPY_HAS_CUPTI)
    message(STATUS "magpy: CUPTI profiler with ${_magpy_cupti_where}")
else()
    target_sources(magpy_core PRIVATE "${_magpy_profile_dir}/null_profiler.cpp")
    if(MAGPY_WITH_CUPTI)
        message(STATUS "magpy: CUPTI not found, kernel profiler disabled (null profiler)")
    else()
        message(STATUS "magpy: MAGPY_WITH_CUPTI=OFF, kernel profiler disabled (null profiler)")
    endif()
endif()
