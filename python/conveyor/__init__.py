"""Conveyor: pipeline model parallelism for PyTorch models, run by a C++ runtime::

    import conveyor
    pipe = conveyor.Pipeline(model, split_points=["layers.2", "head"], microbatches=8, schedule="1f1b",
                             loss_fn=lambda out, target: F.cross_entropy(out.flatten(0, 1), target.flatten()))
    opt = torch.optim.AdamW(pipe.parameters(), lr=1e-3)
    result = pipe.train_step((tokens, mask), target)   # a conveyor.StepResult
    opt.step(); opt.zero_grad()

``help(conveyor.Pipeline)`` documents every argument. Importing the package
also registers Conveyor's operators (``torch.ops.conveyor``) and the
TorchScript class ``torch.classes.conveyor.Pipeline``.
"""
import torch as _torch

from . import _build

__version__ = _build.version

if _torch.__version__ != _build.torch_version:
    raise ImportError(
        f"conveyor {_build.version} was built against torch {_build.torch_version}, but this environment has "
        f"torch {_torch.__version__}; a C++ extension works only with the torch it was built against. Rebuild "
        f"conveyor for this torch (pip install --force-reinstall --no-deps <conveyor source>), or install "
        f"torch=={_build.torch_version}.")

from . import _C  # noqa: E402  (after the version check: another torch's ABI would fail to load, or crash)
from ._errors import DivergenceError, PipelineError, PipelineTimeoutError  # noqa: E402
from ._distributed import process_groups  # noqa: E402
from ._drawing import schedule_names, schedule_svg  # noqa: E402
from ._pipeline import Pipeline  # noqa: E402

StepResult = _C.StepResult
torch_version = _build.torch_version

__all__ = ["Pipeline", "StepResult", "process_groups", "schedule_names", "schedule_svg", "PipelineError",
           "PipelineTimeoutError", "DivergenceError", "__version__", "torch_version"]
