"""conveyor.Pipeline: an nn.Module (or a ScriptModule) cut into stages and
trained under a pipeline schedule by Conveyor's C++ runtime."""
import collections
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from . import _C, _options
from ._arguments import _bool, _fail, _float, _int, _program_file, _script, _tensors
from ._distributed import _check_groups, _shard

__all__ = ["Pipeline"]

Tensors = Union[torch.Tensor, Sequence[Optional[torch.Tensor]]]
LossFn = Callable[[Any, Any], torch.Tensor]

IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])

_DOC = """A model cut into stages that run under a pipeline schedule, each step
split into micro-batches flowing through the stages on worker threads.

Synchronous schedules ("sequential", "gpipe", "1f1b", "eager-1f1b",
"interleaved", "zb-h1", "zb-interleaved") give the gradients of the whole
batch exactly, accumulated into parameters()' .grad as loss.backward()
would; step any torch.optim optimizer over them. Asynchronous ones
("pipedream", "ddg", "fr") update after every micro-batch with the
staleness their method defines, and need the pipeline's own optimizer.
"""


class Pipeline:
    def __init__(self, model: Union[nn.Module, torch.jit.ScriptModule, str], **keywords: Any):
        python, options = _options.split_keywords(keywords)
        loss_fn, lr_schedule, sample = python["loss_fn"], python["lr_schedule"], python["sample"]
        python_loss = None
        if isinstance(loss_fn, (str, torch.jit.ScriptModule)):
            options["loss"] = loss_fn
        elif loss_fn is not None:
            if not callable(loss_fn):
                _fail(TypeError, "loss_fn", "a callable (output, target) -> loss, a name or a scripted module",
                      loss_fn)
            python_loss = loss_fn
        if lr_schedule is not None and not callable(lr_schedule):
            _fail(TypeError, "lr_schedule", "a callable update -> learning rate", lr_schedule)
        if sample is not None:
            options["sample"] = sample
        process_group, replica_group = python["process_group"], python["replica_group"]
        workers = options.get("workers")
        local_rank = _check_groups(process_group, replica_group, workers if type(workers) is int and workers else None)
        if process_group is not None:
            options.setdefault("local_rank", local_rank)
        self._has_loss = loss_fn is not None
        program_file = _program_file(model, python["example_inputs"], options)
        self._model = model if program_file else _script(model, python["example_inputs"])
        target = program_file or (self._model if isinstance(self._model, str) else self._model._c)
        try:
            self._c = _C.Pipeline(target, options, python_loss, lr_schedule, process_group, replica_group)
        finally:
            if program_file:
                os.unlink(program_file)
        self._worker, self._replicas, self._replica = self._c.placement()
        self.training = True

    __init__.__signature__ = _options.signature()

    # --- training and inference -------------------------------------------------------------------------------
    def train_step(self, inputs: Tensors, target: Tensors) -> "_C.StepResult":
        """One training step on a whole batch: splits it into micro-batches,
        runs the schedule, and accumulates the batch's gradients into
        ``parameters()``' ``.grad`` (zero them first, as with
        ``loss.backward()``), or steps the pipeline's own optimizer. Returns
        a ``conveyor.StepResult``. A model of several inputs or targets takes
        tuples. A step that fails raises (``PipelineError``, or what
        ``loss_fn`` raised) and is rolled back."""
        if not self._has_loss:
            raise ValueError("conveyor.Pipeline: train_step needs a loss: build the pipeline with loss_fn=...")
        return self._c.train_step(_tensors("inputs", inputs), _tensors("target", target))

    def forward(self, *inputs: torch.Tensor) -> Union[torch.Tensor, Tuple[torch.Tensor, ...]]:
        """Inference: the model's output (a tuple when it returns several),
        micro-batches flowing through the stages, no autograd graph. Across
        processes, the output is on the last stage's process; None elsewhere."""
        out = self._c.forward(inputs[0] if len(inputs) == 1 else tuple(inputs))
        return None if isinstance(out, tuple) and not out else out

    __call__ = forward

    def clip_grad_norm(self, max_norm: float, norm_type: Union[float, str] = 2.0) -> float:
        """Clips the gradients by their global norm, as
        ``torch.nn.utils.clip_grad_norm_`` on the unsplit model (each tied
        weight once); for a caller's own optimizer, between ``train_step``
        and its step. Returns the norm before clipping."""
        norm = float("inf") if norm_type in ("inf", "infinity") else _float("norm_type", norm_type)
        return self._c.clip_grad_norm(_float("max_norm", max_norm), norm)

    def train(self, mode: bool = True) -> "Pipeline":
        """Training mode of every layer (dropout, batch norm); returns self."""
        self._c.train(_bool("mode", mode))
        self.training = mode
        return self

    def eval(self) -> "Pipeline":
        return self.train(False)

    # --- weights -------------------------------------------------------------------------------------------------
    def parameters(self) -> List[torch.Tensor]:
        """The live weights, stage by stage: what an optimizer steps."""
        return self._c.parameters()

    def named_parameters(self) -> List[Tuple[str, torch.Tensor]]:
        """(name, parameter) pairs, with the model's own names."""
        return self._c.named_parameters()

    def named_buffers(self) -> List[Tuple[str, torch.Tensor]]:
        return self._c.named_buffers()

    def buffers(self) -> List[torch.Tensor]:
        return [b for _, b in self.named_buffers()]

    def state_dict(self) -> "collections.OrderedDict[str, torch.Tensor]":
        """Parameters and buffers by the model's names (detached), for
        ``torch.save``; ``load_state_dict`` takes it back."""
        return collections.OrderedDict(self._c.state_dict())

    def load_state_dict(self, state_dict: Dict[str, torch.Tensor], strict: bool = True) -> IncompatibleKeys:
        """Copies a state dict's tensors into the pipeline. ``strict``: every
        name must match (``ValueError`` names the first that does not);
        otherwise only the names the pipeline has are loaded. Returns the
        missing and unexpected keys."""
        return IncompatibleKeys(*self._c.load_state_dict(list(state_dict.items()), _bool("strict", strict)))

    def save_checkpoint(self, path: Union[str, os.PathLike], step: int = 0) -> None:
        """Weights, buffers, the pipeline's optimizer states, loss scaler,
        step and random streams, in one file (``torch.load`` reads it as a
        dict). A ``torch.optim`` optimizer keeps its own ``state_dict()``."""
        self._c.save_checkpoint(os.fspath(path), _int("step", step, 0))

    def load_checkpoint(self, path: Union[str, os.PathLike]) -> int:
        """Restores what ``save_checkpoint`` saved; returns its step."""
        return self._c.load_checkpoint(os.fspath(path))

    # --- across processes ----------------------------------------------------------------------------------------
    @property
    def worker(self) -> int:
        """The worker this process runs (0 in one process)."""
        return self._worker

    @property
    def replica(self) -> int:
        """This process's replica of the pipeline (0 without a replica_group)."""
        return self._replica

    @property
    def replicas(self) -> int:
        return self._replicas

    def shard(self, batch: Tensors, dim: int = 0) -> Tensors:
        """This replica's equal, contiguous slice of a global batch (a tensor
        or a tuple of them) along ``dim``; the batch itself for one replica.
        Averaging the replicas' gradients equals the global batch's only for
        equal slices: a batch that does not divide is refused."""
        return _shard(batch, self._replica, self._replicas, _int("dim", dim, 0))

    # --- what it is -----------------------------------------------------------------------------------------------
    @property
    def model(self):
        """The TorchScript model (its parameters are the pipeline's on CPU) or ExportedProgram given."""
        return self._model

    @property
    def num_stages(self) -> int:
        return self._c.num_stages()

    @property
    def num_workers(self) -> int:
        return self._c.num_workers()

    @property
    def schedule(self) -> str:
        """The schedule as text: a row of actions per worker."""
        return self._c.schedule()

    @property
    def plan(self) -> str:
        """The split (and, with ``balance="time"``, the predicted times and memory per stage)."""
        return self._c.plan()

    @property
    def prediction(self) -> Optional[dict]:
        """The plan's prediction (``balance="time"``): step seconds, bubble, per stage; else None."""
        return self._c.prediction()

    @property
    def completed_steps(self) -> int:
        return self._c.completed_steps()

    @property
    def fused_ops_report(self) -> str:
        return self._c.fused_ops_report()

    @property
    def options(self) -> Dict[str, Any]:
        """Every option as the pipeline runs with it (after the plan and the front end resolved them)."""
        return self._c.options()

    def __repr__(self) -> str:
        return f"conveyor.Pipeline({self.num_stages} stages on {self.num_workers} workers)\n{self.plan}"


Pipeline.__doc__ = _options.documentation(_DOC)
