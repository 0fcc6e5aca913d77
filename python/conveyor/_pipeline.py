"""conveyor.Pipeline: an nn.Module (or a ScriptModule) cut into stages and
trained under a pipeline schedule by Conveyor's C++ runtime."""
import collections
import os
import textwrap
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from . import _C, _options
from . import _front_end
from ._arguments import _bool, _fail, _float, _int, _tensors
from ._distributed import _check_groups, _shard

__all__ = ["Pipeline"]

Tensors = Union[torch.Tensor, Sequence[Optional[torch.Tensor]]]
LossFn = Callable[[Any, Any], torch.Tensor]

IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])

_DOC = "A model cut into stages that run under a pipeline schedule, each step\nsplit into micro-batches flowing " \
       "through the stages on worker threads.\n\n" + textwrap.fill(
           f"Synchronous schedules ({', '.join(repr(n) for n in _C.schedule_names(True))}) give the gradients of "
           "the whole batch exactly, accumulated into parameters()' .grad as loss.backward() would; step any "
           f"torch.optim optimizer over them. Asynchronous ones ({', '.join(repr(n) for n in _C.schedule_names(False))}) "
           "update after every micro-batch with the staleness their method defines, and need the pipeline's own "
           "optimizer.", width=76) + "\n"


class Pipeline:
    def __init__(self, model: Union[nn.Module, torch.jit.ScriptModule, torch.export.ExportedProgram, str],
                 **keywords: Any):
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
        output, model_kwargs = python["output"], python["model_kwargs"]
        if output is not None and not isinstance(output, (str, int)) and not callable(output):
            _fail(TypeError, "output", "a name, an index or a callable", output)
        if model_kwargs is not None and not isinstance(model_kwargs, dict):
            _fail(TypeError, "model_kwargs", "a dict of keyword arguments", model_kwargs)
        process_group, replica_group = python["process_group"], python["replica_group"]
        workers = options.get("workers")
        local_rank = _check_groups(process_group, replica_group, workers if type(workers) is int and workers else None)
        if process_group is not None:
            options.setdefault("local_rank", local_rank)
        self._has_loss = loss_fn is not None
        # Parsed and checked once, now, even where the build waits for inputs: what needs no model is refused here.
        processes = process_group.size() if process_group is not None else 0
        self._front_end = _front_end.choose(model, python["front_end"], options)
        exported = self._front_end == "export" or isinstance(model, torch.export.ExportedProgram)
        scripted = self._front_end in ("script", "trace") or isinstance(model, torch.jit.ScriptModule)
        # What the model's kind cannot take too, before the export, which may wait for the first step.
        checked = _C.check_options(options, loss_fn is not None, processes,
                                   "export" if exported else "script" if scripted else "")
        if self._front_end in ("export", "trace"):
            _front_end.check_split_point_names(model, options.get("split_points"))
        if self._front_end in ("given", "script") and (output is not None or model_kwargs):
            raise ValueError("conveyor.Pipeline: output and model_kwargs shape the forward that front_end='export' "
                             "or 'trace' records; " + ("the model is given as it runs" if self._front_end == "given"
                                                       else "TorchScript compiles the forward as written"))
        if self._front_end == "trace" and python["example_inputs"] is None and sample is None:
            raise ValueError("conveyor.Pipeline: front_end='trace' records one run: give example_inputs=(...)")
        self._model = model
        self._output, self._model_kwargs = output, dict(model_kwargs or {})
        self._input_names = None  # the forward's keywords, where the batches are dicts
        self._arguments = (options, checked, python_loss, lr_schedule, process_group, replica_group)
        self._c = None
        self.training = True
        self._worker = process_group.rank() if process_group is not None else 0
        self._replicas, self._replica = (replica_group.size(), replica_group.rank()) if replica_group else (1, 0)
        example = python["example_inputs"] if python["example_inputs"] is not None else \
            sample[0] if sample is not None else None
        # An nn.Module is exported (or traced) from inputs: given, or the first step's.
        if self._front_end in ("export", "trace") and example is None:
            return
        self._build(self._inputs("example_inputs", example) if example is not None else None)

    def _build(self, example: Any) -> None:
        options, checked, python_loss, lr_schedule, process_group, replica_group = self._arguments
        model, inputs = self._model, _front_end.as_inputs(example) if example is not None else ()
        names = self._input_names
        if self._front_end == "export":
            built = _front_end.export(model, inputs, self._output, self._model_kwargs, names)
        elif self._front_end == "trace":
            built = _front_end.Built(_front_end.trace(model, inputs, self._output, self._model_kwargs, names)._c)
        elif self._front_end == "script":
            built = _front_end.Built(_front_end.script(model)._c)
        elif isinstance(model, torch.export.ExportedProgram):
            built = _front_end.exported_program(model)
        else:
            built = _front_end.Built(os.fspath(model) if isinstance(model, (str, os.PathLike)) else model._c)
        try:
            self._c = _C.Pipeline(built.model, checked, python_loss, lr_schedule, process_group, replica_group,
                                  built.tensors)
        finally:
            built.close()
        self._worker, self._replicas, self._replica = self._c.placement()
        if not self.training or (self._front_end in ("export", "trace") and not model.training):
            self._c.train(False)
            self.training = False

    def _inputs(self, name: str, value: Any, check: bool = True) -> Any:
        """A batch's inputs as the C++ side takes them: a tensor or a tuple.
        A dict binds its tensors to the forward's keyword arguments by name
        (input_ids=..., decoder_input_ids=...); the first one fixes the
        names and their order, and every later batch must have them."""
        if not isinstance(value, dict):
            if self._input_names is not None:
                raise ValueError(f"conveyor.Pipeline: {name}: the pipeline takes its inputs by name "
                                 f"({', '.join(self._input_names)}): give a dict of them")
            return _tensors(name, value) if check else value
        if self._front_end not in ("export", "trace"):
            raise ValueError(f"conveyor.Pipeline: {name} given by name binds keyword arguments of an nn.Module's "
                             "forward (front_end 'export' or 'trace'); this model takes its inputs positionally")
        if not all(isinstance(k, str) for k in value):
            _fail(TypeError, name, "a dict with str keys", value)
        if self._input_names is None:
            self._input_names = tuple(value)
        if set(value) != set(self._input_names):
            raise ValueError(f"conveyor.Pipeline: {name} has the keys {', '.join(value)}; the pipeline was built "
                             f"for {', '.join(self._input_names)}")
        return _tensors(name, tuple(value[k] for k in self._input_names))

    def _built(self) -> "_C.Pipeline":
        if self._c is None:
            raise RuntimeError("conveyor.Pipeline: the model is exported at the first train_step or forward, from "
                               "its inputs; call one of them first, or build with example_inputs=(...) or sample=")
        return self._c

    __init__.__signature__ = _options.signature()

    # --- training and inference -------------------------------------------------------------------------------
    def train_step(self, inputs: Tensors, target: Tensors) -> "_C.StepResult":
        """One training step on a whole batch: splits it into micro-batches,
        runs the schedule, and accumulates the batch's gradients into
        ``parameters()``' ``.grad`` (zero them first, as with
        ``loss.backward()``), or steps the pipeline's own optimizer. Returns
        a ``conveyor.StepResult``. A model of several inputs or targets takes
        tuples; an nn.Module's inputs may also be a dict binding its
        forward's keyword arguments (input_ids=..., decoder_input_ids=...).
        A step that fails raises (``PipelineError``, or what
        ``loss_fn`` raised) and is rolled back."""
        if not self._has_loss:
            raise ValueError("conveyor.Pipeline: train_step needs a loss: build the pipeline with loss_fn=...")
        inputs, target = self._inputs("inputs", inputs), _tensors("target", target)
        if self._c is None:
            self._build(inputs)
        return self._c.train_step(inputs, target)

    def forward(self, *inputs: torch.Tensor) -> Union[torch.Tensor, Tuple[torch.Tensor, ...]]:
        """Inference: the model's output (a tuple when it returns several),
        micro-batches flowing through the stages, no autograd graph. Across
        processes, the output is on the last stage's process; None elsewhere."""
        given = self._inputs("inputs", inputs[0] if len(inputs) == 1 else tuple(inputs), check=False)
        if self._c is None:
            self._build(given)
        out = self._c.forward(given)
        return None if isinstance(out, tuple) and not out else out

    __call__ = forward

    def clip_grad_norm(self, max_norm: float, norm_type: Union[float, str] = 2.0) -> float:
        """Clips the gradients by their global norm, as
        ``torch.nn.utils.clip_grad_norm_`` on the unsplit model (each tied
        weight once); for a caller's own optimizer, between ``train_step``
        and its step. Returns the norm before clipping."""
        norm = float("inf") if norm_type in ("inf", "infinity") else _float("norm_type", norm_type)
        return self._built().clip_grad_norm(_float("max_norm", max_norm), norm)

    def train(self, mode: bool = True) -> "Pipeline":
        """Training mode of every layer (dropout, batch norm); returns self."""
        if self._c is not None:
            self._c.train(_bool("mode", mode))
        self.training = _bool("mode", mode)
        return self

    def eval(self) -> "Pipeline":
        return self.train(False)

    # --- weights -------------------------------------------------------------------------------------------------
    def parameters(self) -> List[torch.Tensor]:
        """The live weights, stage by stage, each once (a tied weight by its
        first holder's tensor): what an optimizer steps. Before an exported
        model is built (at the first step), the module's own parameters,
        which the pipeline then trains."""
        if self._c is None and self._front_end == "export":
            return list(self._model.parameters())
        return self._built().parameters()

    def named_parameters(self) -> List[Tuple[str, torch.Tensor]]:
        """(name, parameter) pairs, with the model's own names (a tied
        weight once, by its first name, as ``nn.Module.named_parameters``)."""
        if self._c is None and self._front_end == "export":
            return list(self._model.named_parameters())
        return self._built().named_parameters()

    def unshard(self) -> None:
        """With ``shard="parameters"``: gathers this process's stages'
        weights from every replica's pieces (every replica calls it), whole
        until ``reshard()`` or the end of the next step, for
        ``named_parameters()`` and ``state_dict()`` to read. Otherwise
        nothing."""
        self._built().unshard()

    def reshard(self) -> None:
        """Releases what ``unshard()`` gathered; otherwise nothing."""
        self._built().reshard()

    def named_buffers(self) -> List[Tuple[str, torch.Tensor]]:
        if self._c is None and self._front_end == "export":
            return list(self._model.named_buffers())
        return self._built().named_buffers()

    def buffers(self) -> List[torch.Tensor]:
        return [b for _, b in self.named_buffers()]

    def state_dict(self) -> "collections.OrderedDict[str, torch.Tensor]":
        """Parameters and buffers by the model's names (detached), for
        ``torch.save``; ``load_state_dict`` takes it back."""
        if self._c is None and self._front_end == "export":
            return collections.OrderedDict((k, v.detach()) for k, v in self._model.state_dict().items())
        state = self._built().state_dict()
        if isinstance(self._model, nn.Module):  # in the module's own order of keys
            order = {k: i for i, k in enumerate(self._model.state_dict(keep_vars=True))}
            state = sorted(state, key=lambda item: order.get(item[0], len(order)))
        return collections.OrderedDict(state)

    def load_state_dict(self, state_dict: Dict[str, torch.Tensor], strict: bool = True) -> IncompatibleKeys:
        """Copies a state dict's tensors into the pipeline. ``strict``: every
        name must match (``ValueError`` names the first that does not);
        otherwise only the names the pipeline has are loaded. Returns the
        missing and unexpected keys."""
        return IncompatibleKeys(*self._built().load_state_dict(list(state_dict.items()), _bool("strict", strict)))

    def save_checkpoint(self, path: Union[str, os.PathLike], step: int = 0) -> None:
        """Weights, buffers, the pipeline's optimizer states, loss scaler,
        step and random streams, in one file (``torch.load`` reads it as a
        dict). A ``torch.optim`` optimizer keeps its own ``state_dict()``."""
        self._built().save_checkpoint(os.fspath(path), _int("step", step, 0))

    def load_checkpoint(self, path: Union[str, os.PathLike]) -> int:
        """Restores what ``save_checkpoint`` saved; returns its step."""
        return self._built().load_checkpoint(os.fspath(path))

    def save_model_state(self, path: Union[str, os.PathLike]) -> None:
        """The plain state dict, ``{name: tensor}`` by the model's own names,
        written atomically: ``model.load_state_dict(torch.load(path))`` reads
        it into the unsplit model. One process only (across processes, each
        holds only its stages: ``save_checkpoint`` on every rank)."""
        self._built().save_model_state(os.fspath(path))

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
        """The model as given: an nn.Module is the module itself, whose tensors the pipeline trains (on CPU)."""
        return self._model

    @property
    def num_stages(self) -> int:
        return self._built().num_stages()

    @property
    def num_workers(self) -> int:
        return self._built().num_workers()

    @property
    def schedule(self) -> str:
        """The schedule as text: a row of actions per worker."""
        return self._built().schedule()

    @property
    def plan(self) -> str:
        """The split (and, with ``balance="time"``, the predicted times and memory per stage)."""
        return self._built().plan()

    @property
    def prediction(self) -> Optional[dict]:
        """The plan's prediction (``balance="time"``): step seconds, bubble, per stage; else None."""
        return self._built().prediction()

    @property
    def completed_steps(self) -> int:
        return self._built().completed_steps()

    @property
    def fused_ops_report(self) -> str:
        return self._built().fused_ops_report()

    @property
    def options(self) -> Dict[str, Any]:
        """Every option as the pipeline runs with it (after the plan and the front end resolved them)."""
        return self._built().options()

    def __repr__(self) -> str:
        if self._c is None:
            return f"conveyor.Pipeline({type(self._model).__name__}, exported at the first train_step or forward)"
        return f"conveyor.Pipeline({self.num_stages} stages on {self.num_workers} workers)\n{self.plan}"


Pipeline.__doc__ = _options.documentation(_DOC)
