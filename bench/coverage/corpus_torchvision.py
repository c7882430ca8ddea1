"""Every model constructor of the installed torchvision, as coverage-benchmark programs.

The constructors are enumerated with `torchvision.models.list_models(module)` for the
classification, segmentation, detection, video, optical-flow and quantization model modules,
so a newer torchvision brings its new models in without edits here. All models get random
weights (`weights=None`, and `weights_backbone=None` where the builder has a pretrained
backbone by default): nothing is downloaded.

Names: `cls/<model>`, `seg/<model>`, `det/<model>` (the whole detection model on one small
image), `det/<model>.backbone` and `det/<model>.head` (the parts, on batched tensors),
`video/<model>`, `flow/<model>`, `quant/<model>`.

Inputs are as small as each model allows (batch 1): 3x64x64 by default, more where the model
needs it (noted per program). `OVERRIDES` holds the per-model exceptions, `SLOW` the programs
that run only with `--slow` (over ~5 s per call here), and `QUICK` names the
representative subset that `run.py --quick` runs.
"""

import torch

from corpus import Program

try:
    import torchvision
    from torchvision import models as tvm
except Exception as exc:  # pragma: no cover - reported by programs() below
    torchvision = None
    _IMPORT_ERROR = exc


def _image(*shape):
    return lambda: (torch.randn(*shape),)


# The representative subset run by --quick: one or two of each architecture family, the
# smallest variant, plus one model of each non-classification kind.
QUICK = {
    "cls/alexnet", "cls/vgg11", "cls/resnet18", "cls/resnext50_32x4d", "cls/squeezenet1_1",
    "cls/densenet121", "cls/googlenet", "cls/inception_v3", "cls/mobilenet_v2",
    "cls/mobilenet_v3_small", "cls/mnasnet0_5", "cls/shufflenet_v2_x0_5", "cls/efficientnet_b0",
    "cls/efficientnet_v2_s", "cls/regnet_x_400mf", "cls/regnet_y_400mf", "cls/convnext_tiny",
    "cls/swin_t", "cls/swin_v2_t", "cls/vit_b_32",
    "seg/lraspp_mobilenet_v3_large", "seg/deeplabv3_mobilenet_v3_large",
    "det/fasterrcnn_mobilenet_v3_large_320_fpn", "det/ssdlite320_mobilenet_v3_large",
    "det/retinanet_resnet50_fpn.head", "det/fasterrcnn_resnet50_fpn.backbone",
    "video/r3d_18", "flow/raft_small", "quant/quantized_mobilenet_v3_large",
}

# Per-model exceptions to the defaults: builder kwargs, input maker, calls, note, skip, timeout.
OVERRIDES = {
    # classification
    "cls/inception_v3": dict(inputs=_image(1, 3, 75, 75), note="input 75x75 (its minimum)"),
    "cls/maxvit_t": dict(inputs=_image(1, 3, 224, 224), calls=2,
                         note="input 224x224 (partition sizes are fixed at construction)"),
    "cls/vit_b_16": dict(kwargs=dict(image_size=64), note="image_size=64"),
    "cls/vit_b_32": dict(kwargs=dict(image_size=64), note="image_size=64"),
    "cls/vit_l_16": dict(kwargs=dict(image_size=64), note="image_size=64"),
    "cls/vit_l_32": dict(kwargs=dict(image_size=64), note="image_size=64"),
    "cls/vit_h_14": dict(kwargs=dict(image_size=28), inputs=_image(1, 3, 28, 28), calls=2,
                         note="image_size=28"),
    "cls/regnet_y_128gf": dict(calls=2),
    "cls/convnext_large": dict(calls=2),
    # video: (batch, channels, frames, height, width)
    "video/s3d": dict(inputs=_image(1, 3, 16, 224, 224), calls=2,
                      note="input 16x224x224 (fixed 7x7 average pool)"),
    "video/mvit_v1_b": dict(inputs=_image(1, 3, 16, 224, 224), calls=2,
                            note="input 16x224x224 (fixed positional embedding)"),
    "video/mvit_v2_s": dict(inputs=_image(1, 3, 16, 224, 224), calls=2,
                            note="input 16x224x224 (fixed positional embedding)"),
}

# Programs that take more than about 5 s per call on a 2-core CPU (times measured with one
# torch thread). They are listed as skipped unless run.py gets --slow; the backbones and heads
# of the detection models still run.
SLOW = {
    "det/fasterrcnn_resnet50_fpn": "~6 s per call",
    "det/fasterrcnn_resnet50_fpn_v2": "~11 s per call",
    "det/keypointrcnn_resnet50_fpn": "~7 s per call",
    "det/maskrcnn_resnet50_fpn": "~15 s per call (masks pasted per detection)",
    "det/maskrcnn_resnet50_fpn_v2": "~14 s per call (masks pasted per detection)",
    "video/mvit_v1_b": "~50 s per call at the fixed 16x224x224",
    "video/mvit_v2_s": "~45 s per call at the fixed 16x224x224",
}


def _builder_kwargs(module_name, name):
    kw = {"weights": None}
    if module_name in ("segmentation", "detection"):
        kw["weights_backbone"] = None
    if module_name == "quantization":
        kw["quantize"] = False
    return kw


def _make(name, **kwargs):
    def make():
        return tvm.get_model(name, **kwargs)
    return make


def _classification(names):
    out = []
    for n in names:
        key = f"cls/{n}"
        ov = OVERRIDES.get(key, {})
        kw = dict(_builder_kwargs("classification", n), **ov.get("kwargs", {}))
        out.append(Program(key, _make(n, **kw), ov.get("inputs", _image(1, 3, 64, 64)),
                           quick=key in QUICK, calls=ov.get("calls", 3),
                           note=ov.get("note", ""), tags=("torchvision", "classification")))
    return out


def _segmentation(names):
    return [Program(f"seg/{n}", _make(n, **_builder_kwargs("segmentation", n)),
                    _image(1, 3, 64, 64), quick=f"seg/{n}" in QUICK,
                    tags=("torchvision", "segmentation"))
            for n in names]


def _det_image_size(name):
    if name.startswith("ssd300"):
        return 300
    if name.startswith("ssdlite320"):
        return 320
    return 128


def _det_kwargs(name):
    kw = _builder_kwargs("detection", name)
    if not name.startswith("ssd"):
        # GeneralizedRCNNTransform resizes to min_size (800 by default): keep it small
        kw.update(min_size=128, max_size=128)
    # Keep every scored box: untrained heads score below the default thresholds, so without
    # this the outputs are empty and non-maximum suppression, top-k and the box decoding that
    # depend on data are never compared with eager.
    kw["box_score_thresh" if "rcnn" in name else "score_thresh"] = 0.0
    return kw


def _det_part(name, path):
    """A part of a detection model (its backbone or a head), found by attribute path."""
    def make():
        part = tvm.get_model(name, **_det_kwargs(name))
        for attr in path.split("."):
            part = getattr(part, attr)
        return part
    return make


def _fpn_features():
    # five FPN levels of 256 channels, as the heads of the 128x128-input models see them
    return ([torch.randn(1, 256, s, s) for s in (32, 16, 8, 4, 2)],)


def _detection(names):
    out = []
    for n in names:
        size = _det_image_size(n)
        key = f"det/{n}"
        out.append(Program(key, _make(n, **_det_kwargs(n)),
                           (lambda s: lambda: ([torch.rand(3, s, s)],))(size),
                           quick=key in QUICK, calls=2, note=f"one {size}x{size} image",
                           slow=SLOW.get(key), tags=("torchvision", "detection")))
        out.append(Program(f"{key}.backbone", _det_part(n, "backbone"), _image(1, 3, size, size),
                           quick=f"{key}.backbone" in QUICK, note=f"input {size}x{size}",
                           tags=("torchvision", "detection", "part")))
        if "rcnn" in n:
            head = "rpn.head"
        elif n.startswith(("retinanet", "fcos")):
            head = "head"
        else:
            head = None  # SSD heads take per-level channel counts; their backbones are covered
        if head:
            out.append(Program(f"{key}.head", _det_part(n, head), _fpn_features,
                               quick=f"{key}.head" in QUICK,
                               note=f"model.{head} on five 256-channel FPN levels",
                               tags=("torchvision", "detection", "part")))
    return out


def _video(names):
    out = []
    for n in names:
        key = f"video/{n}"
        ov = OVERRIDES.get(key, {})
        out.append(Program(key, _make(n, **_builder_kwargs("video", n)),
                           ov.get("inputs", _image(1, 3, 4, 32, 32)), quick=key in QUICK,
                           calls=ov.get("calls", 3), note=ov.get("note", "input 4x32x32"),
                           slow=SLOW.get(key),
                           tags=("torchvision", "video")))
    return out


def _flow(names):
    def pair():
        return torch.rand(1, 3, 128, 128), torch.rand(1, 3, 128, 128)
    return [Program(f"flow/{n}", _make(n, **_builder_kwargs("optical_flow", n)), pair,
                    quick=f"flow/{n}" in QUICK, calls=2 if "large" in n else 3,
                    note="two 128x128 images, 12 flow updates", tags=("torchvision", "flow"))
            for n in names]


def _quantization(names):
    engines = torch.backends.quantized.supported_engines
    real = "fbgemm" in engines or "x86" in engines
    note = ("quantize=False: the quantizable float model (QuantStub, FloatFunctional); "
            + ("quantize=True also possible here" if real else
               "quantize=True needs the fbgemm/x86 quantized engine, absent in this torch "
               f"(engines: {', '.join(engines)})"))
    return [Program(f"quant/{n}", _make(n, **_builder_kwargs("quantization", n)),
                    _image(1, 3, 75, 75) if "inception" in n else _image(1, 3, 64, 64),
                    quick=f"quant/{n}" in QUICK, note=note, tags=("torchvision", "quantization"))
            for n in names]


def programs():
    if torchvision is None:
        return [Program("torchvision/import", None, None,
                        skip=f"torchvision does not import: {_IMPORT_ERROR!r}")]
    out = []
    kinds = [(tvm, _classification), (getattr(tvm, "segmentation", None), _segmentation),
             (getattr(tvm, "detection", None), _detection), (getattr(tvm, "video", None), _video),
             (getattr(tvm, "optical_flow", None), _flow),
             (getattr(tvm, "quantization", None), _quantization)]
    for module, build in kinds:
        if module is not None:
            out.extend(build(sorted(tvm.list_models(module))))
    return out
