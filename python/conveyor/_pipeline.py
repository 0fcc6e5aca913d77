"""conveyor.Pipeline: an nn.Module (or a ScriptModule) cut into stages and
trained under a pipeline schedule by Conveyor's C++ runtime."""
import collections
import difflib
import inspect
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from . import _C
from ._arguments import _bool, _fail, _float, _int, _ints, _program_file, _script, _str, _strs, _tensors
from ._distributed import _check_groups, _shard

__all__ = ["Pipeline"]

Tensors = Union[torch.Tensor, Sequence[Optional[torch.Tensor]]]
LossFn = Callable[[Any, Any], torch.Tensor]

_ASYNCHRONOUS = ("pipedream", "ddg", "fr")

IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


class Pipeline:
    """A model cut into stages that run under a pipeline schedule, each step
    split into micro-batches flowing through the stages on worker threads.

    Synchronous schedules (``sequential``, ``gpipe``, ``1f1b``, ``eager-1f1b``,
    ``interleaved``, ``zb-h1``, ``zb-interleaved``) give the gradients of the
    whole batch exactly, accumulated into ``parameters()``' ``.grad`` as
    ``loss.backward()`` would; step any ``torch.optim`` optimizer over them.
    Asynchronous ones (``pipedream``, ``ddg``, ``fr``) update after every
    micro-batch with the staleness their method defines, and need the
    pipeline's own ``optimizer``.

    Args:
        model: an ``nn.Module`` (scripted here with ``torch.jit.script``, or
            traced with ``example_inputs``), a ``torch.jit.ScriptModule``, or
            the path of one saved with ``torch.jit.save``: the pipeline trains
            the model's own parameter tensors (on CPU). Or a torch.export
            program (dynamic batch) or its ``.pt2``: C++ runs its graph, trains a copy of its weights.
        split_points: submodule names whose calls begin a new stage
            (``["layers.2", "head"]``: three stages). Without them the
            forward must be a plain chain of submodules, cut into ``workers``
            stages by ``balance``.
        workers: threads running the stages (one stage each, or ``chunks``).
        microbatches: micro-batches each batch is split into.
        schedule: the schedule's name (above).
        loss_fn: ``loss_fn(output, target) -> scalar tensor``, any Python
            callable (called on the last stage's thread with the GIL held for
            the call; output and target are tensors, or tuples of them for
            several), or ``"cross_entropy"`` / ``"mse"``, or a scripted
            module. ``loss_reduction`` says whether it returns a mean (the
            default) or a sum over its micro-batch.
        devices: each worker's device (``"cpu"``, ``"cuda:1"``); one entry
            for all.
        chunks: stages per worker for the interleaved schedules.
        lookahead: for ``"eager-1f1b"``, the forwards each stage runs ahead
            of 1F1B's warm-up per later stage (default 1): it hides a slow
            link's latency for that many more stashed micro-batches.
        balance: ``"uniform"`` (layers), ``"parameters"`` or ``"time"``
            (measured on ``sample``; the plan then predicts the step).
        sample: an ``(inputs, target)`` batch for ``balance="time"`` and
            ``plan="auto"``.
        plan: ``"auto"``: search the whole plan on the profile of ``sample``
            (workers, schedule, chunks, micro-batches, recomputation, split)
            for the fastest predicted step within ``max_workers`` (default
            ``workers``, else 4) and ``memory_budget`` (bytes per worker);
            ``"tuned"``: then race twelve of them on ``sample``, the slower
            half dropped each round. ``pipe.plan`` prints them.
        batch_dim: the dimension batches are split along.
        shared_inputs, shared_targets: indices of inputs or targets passed
            whole to every micro-batch (a ``[T, T]`` mask).
        tied_parameters: groups of parameter names that are one weight.
        schedule_text: a schedule in text form, instead of ``schedule``.
        recompute, offload: activation recomputation (offloaded inputs).
        vertical_sync: PipeDream's vertical sync.
        stage_rng: per-stage random streams (reproducible dropout).
        channel_capacity: messages a stage-to-stage channel buffers.
        timeout: seconds any blocking wait may take before the step fails
            with ``PipelineTimeoutError``.
        trace: record each action's times (``StepResult.trace``, timelines).
        divergence_guard: stop at a non-finite loss or gradient
            (``DivergenceError``), keeping the last good weights.
        free_sent_activations: once a stage has sent its outputs to another
            process or device, release their data and keep their graph (all
            the backward needs); ``False`` keeps them.
        loss_reduction: ``"mean"`` or ``"sum"``.
        shard_optimizer_state: with replicas (``replica_group``) and the
            pipeline's own ``optimizer``, each replica of a stage keeps the
            optimizer state of 1/D of its weights (ZeRO stage 1): gradients
            are reduce-scattered, each replica updates its part, the weights
            are all-gathered; the same weights as without.
        shared_memory: with ``process_group``, whether neighbouring
            processes on one machine pass activations and gradients through
            shared memory (the default) rather than Gloo's sockets; processes
            on other machines use Gloo either way.
        optimizer: the pipeline's own optimizer, one per stage: ``"sgd"``,
            ``"adam"`` or ``"adamw"``, with ``lr``, ``momentum`` (sgd) and
            ``weight_decay``; ``train_step`` steps it.
        lr_schedule: ``lr_schedule(update) -> lr`` for the pipeline's
            optimizer; ``lr_schedule_unit`` counts updates per ``"batch"``
            (synchronous schedules, the default for them) or
            ``"microbatch"`` (asynchronous ones).
        autocast: mixed precision, ``"bf16"`` or ``"fp16"`` (or the dtype).
        loss_scaling: dynamic loss scaling (``True``, or a dict of
            ``init_scale``, ``growth_factor``, ``backoff_factor``,
            ``growth_interval``); needs ``optimizer``.
        clip_grad_norm: clip the gradients' global norm to this before the
            pipeline's optimizer steps; ``clip_norm_type`` (2, any p, or
            ``"inf"``).
        accumulate_steps: the pipeline's optimizer steps every n-th step.
        fused_ops: swap Conveyor's fused LSTM into the model.
        optimize: let the TorchScript executor optimize the stages.
        example_inputs: trace ``model`` with these instead of scripting it.
        process_group: run across processes (under ``torchrun``, after
            ``torch.distributed.init_process_group``): the group of this
            replica's processes, each running one worker's stages (its rank
            in the group is the worker; ``workers`` is its size). Every
            process builds the pipeline from the same model and options and
            calls ``train_step`` with the same batch (its replica's shard);
            ``parameters()`` and ``state_dict()`` are then its own stages',
            ``StepResult.loss`` the whole batch's on every process.
        replica_group: with ``process_group``, data parallelism across D
            replicas of the pipeline: the processes running this worker in
            every replica. Gradients are averaged across it; replica 0's
            initial weights are broadcast. ``conveyor.process_groups(workers)``
            makes both groups.

    Unknown keywords are refused by name (``TypeError``), values of the wrong
    type with ``TypeError``, bad values with ``ValueError``.
    """

    def __init__(self, model: Union[nn.Module, torch.jit.ScriptModule, str], *,
                 split_points: Optional[Sequence[str]] = None, workers: Optional[int] = None,
                 microbatches: int = 1, schedule: str = "1f1b", loss_fn: Union[LossFn, str, None] = None,
                 devices: Union[str, Sequence[str], None] = None, chunks: Optional[int] = None,
                 lookahead: Optional[int] = None,
                 balance: str = "uniform", sample: Optional[Tuple[Tensors, Tensors]] = None, batch_dim: int = 0,
                 shared_inputs: Sequence[int] = (), shared_targets: Sequence[int] = (),
                 tied_parameters: Sequence[Sequence[str]] = (), schedule_text: Optional[str] = None,
                 recompute: bool = False, offload: bool = False, vertical_sync: bool = False,
                 stage_rng: bool = False, channel_capacity: int = 2, timeout: float = 300.0, trace: bool = True,
                 divergence_guard: bool = True, free_sent_activations: bool = True,
                 loss_reduction: str = "mean", optimizer: Optional[str] = None,
                 lr: Optional[float] = None, momentum: Optional[float] = None,
                 weight_decay: Optional[float] = None, lr_schedule: Optional[Callable[[int], float]] = None,
                 lr_schedule_unit: Optional[str] = None, autocast: Union[str, torch.dtype, None] = None,
                 loss_scaling: Union[bool, Dict[str, float], None] = None, clip_grad_norm: Optional[float] = None,
                 clip_norm_type: Union[float, str] = 2.0, accumulate_steps: int = 1, fused_ops: bool = False,
                 optimize: bool = False, example_inputs: Optional[Tensors] = None,
                 plan: Optional[str] = None, max_workers: Optional[int] = None,
                 memory_budget: Optional[int] = None, process_group: Optional[Any] = None,
                 replica_group: Optional[Any] = None, shard_optimizer_state: bool = False,
                 shared_memory: Optional[bool] = None, **unknown: Any):
        if unknown:
            known = [p for p in inspect.signature(Pipeline.__init__).parameters if p not in ("self", "model", "unknown")]
            name = sorted(unknown)[0]
            hint = {"stages": "workers (threads) or split_points (where stages begin)",
                    "loss": "loss_fn", "num_microbatches": "microbatches", "chunks_per_worker": "chunks"}.get(name)
            close = hint or ", ".join(difflib.get_close_matches(name, known, n=3))
            raise TypeError(f"conveyor.Pipeline: unknown keyword argument '{name}'" +
                            (f"; did you mean {close}?" if close else "") + " (help(conveyor.Pipeline) lists them)")
        if _float("timeout", timeout) <= 0:
            _fail(ValueError, "timeout", "a positive number of seconds", timeout)
        options: Dict[str, Any] = {
            "microbatches": _int("microbatches", microbatches, 1),
            "schedule": _str("schedule", schedule),
            "balance": _str("balance", balance, ("uniform", "parameters", "time")),
            "batch_dim": _int("batch_dim", batch_dim, 0),
            "recompute": _bool("recompute", recompute), "offload": _bool("offload", offload),
            "vertical_sync": _bool("vertical_sync", vertical_sync), "stage_rng": _bool("stage_rng", stage_rng),
            "channel_capacity": _int("channel_capacity", channel_capacity, 0),
            "timeout_ms": max(1, int(round(timeout * 1000))),
            "trace": _bool("trace", trace), "divergence_guard": _bool("divergence_guard", divergence_guard),
            "free_sent_activations": _bool("free_sent_activations", free_sent_activations),
            "loss_reduction": _str("loss_reduction", loss_reduction, ("mean", "sum")),
            "accumulate_steps": _int("accumulate_steps", accumulate_steps, 1),
            "fused_ops": _bool("fused_ops", fused_ops), "optimize": _bool("optimize", optimize),
            "shard_optimizer_state": _bool("shard_optimizer_state", shard_optimizer_state),
        }
        if split_points is not None:
            options["split_points"] = _strs("split_points", split_points)
        if workers is not None:
            options["workers"] = _int("workers", workers, 1)
        if chunks is not None:
            options["chunks"] = _int("chunks", chunks, 1)
        if lookahead is not None:
            options["lookahead"] = _int("lookahead", lookahead, 1)
        if devices is not None:
            options["devices"] = _strs("devices", devices)
        if schedule_text is not None:
            options["schedule_text"] = _str("schedule_text", schedule_text)
        if shared_inputs:
            options["shared_inputs"] = _ints("shared_inputs", shared_inputs)
        if shared_targets:
            options["shared_targets"] = _ints("shared_targets", shared_targets)
        if tied_parameters:
            if not isinstance(tied_parameters, (list, tuple)):
                _fail(TypeError, "tied_parameters", "a list of lists of parameter names", tied_parameters)
            options["tied_parameters"] = [_strs("tied_parameters", g) for g in tied_parameters]
        if sample is not None:
            if not isinstance(sample, tuple) or len(sample) != 2:
                _fail(TypeError, "sample", "an (inputs, target) tuple", sample)
            options["sample"] = (_tensors("sample", sample[0]), _tensors("sample", sample[1]))
        if plan is not None:
            options["plan"] = _str("plan", plan, ("auto", "tuned"))
        if max_workers is not None:
            options["max_workers"] = _int("max_workers", max_workers, 1)
        if memory_budget is not None:
            options["memory_budget"] = _int("memory_budget", memory_budget, 1)
        if shared_memory is not None:
            options["shared_memory"] = _bool("shared_memory", shared_memory)
        if optimizer is not None:
            options["optimizer"] = _str("optimizer", optimizer, ("sgd", "adam", "adamw"))
        for name, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            if value is not None:
                options[name] = _float(name, value)
        if lr_schedule is not None and not callable(lr_schedule):
            _fail(TypeError, "lr_schedule", "a callable update -> learning rate", lr_schedule)
        if lr_schedule_unit is None and lr_schedule is not None:
            lr_schedule_unit = "microbatch" if schedule in _ASYNCHRONOUS else "batch"
        if lr_schedule_unit is not None:
            options["lr_schedule_unit"] = _str("lr_schedule_unit", lr_schedule_unit, ("batch", "microbatch"))
        if autocast is not None:
            dtypes = {torch.bfloat16: "bf16", torch.float16: "fp16"}
            options["autocast"] = dtypes[autocast] if autocast in dtypes else _str(
                "autocast", autocast, ("bf16", "fp16", "bfloat16", "float16"))
        if loss_scaling is not None:
            if isinstance(loss_scaling, dict):
                options["loss_scaling"] = {str(k): _float(f"loss_scaling['{k}']", v) for k, v in loss_scaling.items()}
            else:
                options["loss_scaling"] = _bool("loss_scaling", loss_scaling)
        if clip_grad_norm is not None:
            options["clip_grad_norm"] = _float("clip_grad_norm", clip_grad_norm)
        options["clip_norm_type"] = clip_norm_type if clip_norm_type in ("inf", "infinity") else _float(
            "clip_norm_type", clip_norm_type)
        python_loss = None
        if isinstance(loss_fn, (str, torch.jit.ScriptModule)):
            options["loss"] = loss_fn
        elif loss_fn is not None:
            if not callable(loss_fn):
                _fail(TypeError, "loss_fn", "a callable (output, target) -> loss, a name or a scripted module",
                      loss_fn)
            python_loss = loss_fn
        local_rank = _check_groups(process_group, replica_group, workers)
        self._has_loss = loss_fn is not None
        program_file = _program_file(model, example_inputs, options)
        self._model = model if program_file else _script(model, example_inputs)
        target = program_file or (self._model if isinstance(self._model, str) else self._model._c)
        try:
            self._c = _C.Pipeline(target, options, python_loss, lr_schedule, process_group, replica_group, local_rank)
        finally:
            if program_file:
                os.unlink(program_file)
        self._worker, self._replicas, self._replica = self._c.placement()
        self.training = True

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
        out = collections.OrderedDict((n, p.detach()) for n, p in self.named_parameters())
        out.update((n, b.detach()) for n, b in self.named_buffers())
        return out

    def load_state_dict(self, state_dict: Dict[str, torch.Tensor], strict: bool = True) -> IncompatibleKeys:
        """Copies a state dict's tensors into the pipeline. ``strict``: every
        name must match (``ValueError`` names the first that does not);
        otherwise only the names the pipeline has are loaded. Returns the
        missing and unexpected keys."""
        current = self.state_dict()
        missing = [k for k in current if k not in state_dict]
        unexpected = [k for k in state_dict if k not in current]
        if strict and (missing or unexpected):
            what = f"missing '{missing[0]}'" if missing else f"unexpected '{unexpected[0]}'"
            raise ValueError(f"conveyor.Pipeline.load_state_dict: {what} ({len(missing)} missing, "
                             f"{len(unexpected)} unexpected; strict=False loads the rest)")
        self._c.load_state_dict([(k, state_dict.get(k, v)) for k, v in current.items()])
        return IncompatibleKeys(missing, unexpected)

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

    def __repr__(self) -> str:
        return f"conveyor.Pipeline({self.num_stages} stages on {self.num_workers} workers)\n{self.plan}"
