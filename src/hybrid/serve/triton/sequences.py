"""Triton's sequence batcher for stateful models: control inputs, implicit state, a sequence's requests in order.

A model whose ``config.pbtxt`` has ``sequence_batching`` serves sequences of requests (a stream of audio chunks,
the steps of a recurrent model). Each request names its sequence with the request parameters ``sequence_id``
(a non-zero integer or a non-empty string), ``sequence_start`` (its first request) and ``sequence_end`` (its
last): tritonclient's ``infer(..., sequence_id=, sequence_start=, sequence_end=)``. The server then

- checks, as Triton does: a request without a sequence id, a first request without ``sequence_start``, one
  after the sequence ended or was idle longer than ``max_sequence_idle_microseconds`` (default 1 s), and, when
  the model batches, a request of more than one row are refused (HYB-702, 400, Triton's wording); so is, unlike
  Triton (which feeds an unrelated number), an id the CORRID control cannot hold (a string or an integer out of
  its type's range);
- runs a sequence's requests one after the other, in the order they came; requests of different sequences
  batch together (with ``max_batch_size > 0``: up to it, waiting at most the strategy's
  ``max_queue_delay_microseconds``, 0 by default);
- feeds the model's control inputs (``control_input``): ``CONTROL_SEQUENCE_START``, ``_END`` and ``_READY`` as
  the false/true values the configuration gives (``int32_false_true``, ``fp32_false_true``,
  ``bool_false_true``), ``CONTROL_SEQUENCE_CORRID`` as the sequence id in its ``data_type``; READY is always true
  (a batch holds only requests that are ready, never an empty slot as in Triton's ``direct`` strategy);
- keeps the model's state between the requests of a sequence (``state``, Triton's implicit state): the output
  ``output_name`` of one request is the input ``input_name`` of the next; the first request of a sequence gets
  ``initial_state`` (``zero_data``, or ``data_file`` read from the model folder's ``initial_state/``), else
  zeros. A state output reaches the client only where ``config.pbtxt``'s ``output`` lists it.

Clients send only the model's other inputs: the model's metadata and configuration list those, as Triton's do.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from hybrid.errors import ServingError

if TYPE_CHECKING:
    from hybrid.ir.signature import Signature

__all__ = ["Control", "SequenceFlags", "SequenceSettings", "Sequences", "State", "sequence_flags",
           "visible_signature"]

_HINT = "tritonclient: infer(..., sequence_id=ID, sequence_start=True) on a sequence's first request"
_Control = mc.ModelSequenceBatching.Control
_KINDS = {_Control.CONTROL_SEQUENCE_START: "START", _Control.CONTROL_SEQUENCE_END: "END",
          _Control.CONTROL_SEQUENCE_READY: "READY", _Control.CONTROL_SEQUENCE_CORRID: "CORRID"}
_NUMPY = {mc.TYPE_BOOL: np.bool_, mc.TYPE_UINT8: np.uint8, mc.TYPE_UINT16: np.uint16, mc.TYPE_UINT32: np.uint32,
          mc.TYPE_UINT64: np.uint64, mc.TYPE_INT8: np.int8, mc.TYPE_INT16: np.int16, mc.TYPE_INT32: np.int32,
          mc.TYPE_INT64: np.int64, mc.TYPE_FP16: np.float16, mc.TYPE_FP32: np.float32, mc.TYPE_FP64: np.float64,
          mc.TYPE_STRING: np.object_}
_IDLE_DEFAULT_US = 1_000_000  # Triton's default max_sequence_idle_microseconds


def _error(message: str, hint: str | None = None) -> ServingError:
    return ServingError("HYB-707", message, hint)


@dataclass(frozen=True, slots=True)
class SequenceFlags:
    """A request's place in its sequence: the request parameters ``sequence_id``, ``sequence_start``, ``_end``."""

    id: int | str
    start: bool = False
    end: bool = False


def sequence_flags(sequence_id: Any, start: Any, end: Any) -> SequenceFlags | None:
    """The flags of a request's parameters (None: it names no sequence).

    Raises:
        ServingError: HYB-702 for a sequence id that is not a non-negative integer or a string, or flags that
            are not true or false.
    """
    if sequence_id is None and start is None and end is None:
        return None
    if sequence_id is None:
        sequence_id = 0
    if isinstance(sequence_id, bool) or not isinstance(sequence_id, (int, str)) \
            or (isinstance(sequence_id, int) and not 0 <= sequence_id < 1 << 64):
        raise ServingError("HYB-702", f"'sequence_id' must be an unsigned 64-bit integer or a string, got "
                           f"{sequence_id!r}", _HINT)
    for name, flag in (("sequence_start", start), ("sequence_end", end)):
        if flag is not None and not isinstance(flag, bool):
            raise ServingError("HYB-702", f"{name!r} must be true or false, got {flag!r}", _HINT)
    return SequenceFlags(sequence_id, bool(start), bool(end))


@dataclass(frozen=True, slots=True)
class Control:
    """A control input: the model input ``name`` that carries ``kind`` (START, END, READY or CORRID)."""

    name: str
    kind: str
    dtype: np.dtype
    false_true: tuple[Any, Any] = (0, 1)


@dataclass(frozen=True, slots=True)
class State:
    """An implicit state: output ``output_name`` of a request is input ``input_name`` of the next."""

    input_name: str
    output_name: str
    initial: np.ndarray  # without the batch dimension


@dataclass(frozen=True, slots=True)
class SequenceSettings:
    """A model's sequence batching (``config.pbtxt``'s ``sequence_batching``), checked against the model.

    Attributes:
        controls: The control inputs.
        states: The implicit states.
        idle_s: Longest time a sequence may go without a request before it is released.
        visible_outputs: The state outputs the configuration lists as outputs (the client may ask for them).
    """

    controls: tuple[Control, ...] = ()
    states: tuple[State, ...] = ()
    idle_s: float = _IDLE_DEFAULT_US / 1e6
    visible_outputs: frozenset[str] = field(default_factory=frozenset)

    @property
    def server_inputs(self) -> frozenset[str]:
        """The model inputs the server feeds (controls and input states): clients do not send them."""
        return frozenset(c.name for c in self.controls) | frozenset(s.input_name for s in self.states)

    @property
    def hidden_outputs(self) -> frozenset[str]:
        """The state outputs the client does not get."""
        return frozenset(s.output_name for s in self.states) - self.visible_outputs

    @classmethod
    def from_config(cls, config: mc.ModelConfig, signature: Signature, where: str,
                    folder: Path | None = None) -> SequenceSettings | None:
        """The sequence batching of ``config`` (None without ``sequence_batching``).

        Raises:
            ServingError: HYB-707 for a control or state that does not match the model's inputs and outputs,
                a control without its values or data type, or an initial state that cannot be read.
        """
        if not config.HasField("sequence_batching"):
            return None
        sb = config.sequence_batching
        inputs = {s.name: s for s in signature.inputs}
        outputs = {s.name: s for s in signature.outputs}
        controls = []
        for entry in sb.control_input:
            if entry.name not in inputs:
                raise _error(f"{where}: control input {entry.name!r} is not an input of the model; its inputs: "
                             f"{', '.join(inputs)}")
            if len(entry.control) != 1:
                raise _error(f"{where}: control input {entry.name!r} must have exactly one control, got "
                             f"{len(entry.control)}")
            controls.append(_control(entry.name, entry.control[0], inputs[entry.name].dtype, where))
        states = []
        for entry in sb.state:
            if entry.input_name not in inputs or entry.output_name not in outputs:
                raise _error(f"{where}: state {entry.input_name!r} -> {entry.output_name!r} must name an input and "
                             f"an output of the model; its inputs: {', '.join(inputs)}; its outputs: "
                             f"{', '.join(outputs)}")
            states.append(State(entry.input_name, entry.output_name, _initial(entry, where, folder)))
        idle = sb.max_sequence_idle_microseconds or _IDLE_DEFAULT_US
        listed = {o.name for o in config.output}
        return cls(tuple(controls), tuple(states), idle / 1e6,
                   frozenset(s.output_name for s in states if s.output_name in listed))


def _control(name: str, control: Any, dtype: np.dtype | None, where: str) -> Control:
    kind = _KINDS.get(control.kind)
    if kind is None:
        raise _error(f"{where}: control input {name!r}: kind {_Control.Kind.Name(control.kind)} is not supported "
                     "(START, END, READY and CORRID are)")
    if kind == "CORRID":
        if control.data_type not in _NUMPY or control.data_type == mc.TYPE_BOOL:
            raise _error(f"{where}: control input {name!r} (CORRID) needs a data_type: TYPE_UINT64, TYPE_INT64, "
                         "TYPE_UINT32, TYPE_INT32 or TYPE_STRING")
        wanted = np.dtype(_NUMPY[control.data_type])
        values: tuple[Any, Any] = (0, 1)
    else:
        pairs = [(np.dtype(np.int32), list(control.int32_false_true)),
                 (np.dtype(np.float32), list(control.fp32_false_true)),
                 (np.dtype(np.bool_), list(control.bool_false_true))]
        given = [(dt, v) for dt, v in pairs if v]
        if len(given) != 1 or len(given[0][1]) != 2:
            raise _error(f"{where}: control input {name!r} ({kind}) needs one of int32_false_true, fp32_false_true "
                         "or bool_false_true, with two values (false, true)")
        wanted, (false, true) = given[0][0], given[0][1]
        values = (false, true)
    if dtype is not None and dtype != wanted:
        raise _error(f"{where}: control input {name!r} is {wanted} in config.pbtxt, the model's input is {dtype}")
    return Control(name, kind, wanted, values)


def _initial(entry: Any, where: str, folder: Path | None) -> np.ndarray:
    dtype = _NUMPY.get(entry.data_type)
    if dtype is None or dtype is np.object_:
        raise _error(f"{where}: state {entry.input_name!r} needs a numeric data_type")
    given = list(entry.initial_state)
    if not given:
        return np.zeros([max(0, d) for d in entry.dims], dtype)  # a variable dim starts empty
    if len(given) > 1:
        raise _error(f"{where}: state {entry.input_name!r} has {len(given)} initial states; pyasc takes one")
    init = given[0]
    dims = [int(d) for d in init.dims]
    if any(d < 0 for d in dims):
        raise _error(f"{where}: the initial state of {entry.input_name!r} needs fixed dims, got {dims}")
    if init.HasField("data_file"):
        if folder is None:
            raise _error(f"{where}: the initial state of {entry.input_name!r} reads a file, but the model has "
                         "no folder")
        base = (folder / "initial_state").resolve()
        path = (base / init.data_file).resolve()
        if base not in path.parents or not path.is_file():
            raise _error(f"{where}: initial state file {init.data_file!r} is not a file in {base}")
        raw = path.read_bytes()
        want = int(np.prod(dims)) * np.dtype(dtype).itemsize
        if len(raw) != want:
            raise _error(f"{where}: initial state file {path} holds {len(raw)} bytes; dims {dims} of "
                         f"{np.dtype(dtype)} need {want}")
        return np.frombuffer(raw, np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(dims)
    return np.zeros(dims, dtype)


def _frozen(array: np.ndarray) -> np.ndarray:
    """``array``, read-only: one array is fed to every request that needs it."""
    array.flags.writeable = False
    return array


class _Sequence:
    __slots__ = ("ended", "last", "lock", "pending", "states")

    def __init__(self, now: float) -> None:
        self.lock = asyncio.Lock()
        self.states: dict[str, np.ndarray] = {}
        self.pending = 0
        self.last = now
        self.ended = False


class Sequences:
    """The sequences in flight of one model: their order, their state, their release when idle.

    Args:
        settings: The model's sequence batching.
        model: The model's name (in messages).
        batched: Whether the model batches (``max_batch_size > 0``): the controls and states then have a batch
            dimension of 1, and a request must hold one row.
        clock: Seconds of a monotonic clock (injected in tests).
    """

    def __init__(self, settings: SequenceSettings, model: str, batched: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.model = model
        self.batched = batched
        self._clock = clock
        self._live: dict[int | str, _Sequence] = {}
        self._swept = clock()
        self._shape = (1, 1) if batched else (1,)  # a control's shape: Triton's [batch, 1] or [1]
        self._initial = {s.input_name: _frozen(s.initial[None] if batched else s.initial) for s in settings.states}
        self._pairs = [(s.input_name, s.output_name) for s in settings.states]
        self._hidden = settings.hidden_outputs
        self._controls = [(c, _frozen(np.full(self._shape, c.false_true[0], c.dtype)),
                           _frozen(np.full(self._shape, c.false_true[1], c.dtype))) for c in settings.controls]

    def __len__(self) -> int:
        return len(self._live)

    async def run(self, flags: SequenceFlags | None, rows: int, feeds: dict[str, np.ndarray],
                  queue: Callable[[], Awaitable[dict[str, np.ndarray]]]) -> dict[str, np.ndarray]:
        """Run one request of a sequence: after the sequence's earlier ones, with its controls and state.

        Args:
            flags: The request's sequence parameters.
            rows: Its batch rows.
            feeds: Its checked inputs; the controls and input states are added to them.
            queue: Runs the request (the model's queue), once its feeds are complete.

        Returns:
            Its outputs, without the state outputs the client does not see.

        Raises:
            ServingError: HYB-702 (Triton's wording) for a request without a sequence id, of more than one row
                to a batching model, or to a sequence that has not started (or ended, or was idle too long).
        """
        if flags is None or flags.id in (0, ""):
            raise ServingError("HYB-702", f"inference request to model {self.model!r} must specify a non-zero or "
                               "non-empty correlation ID", _HINT)
        if self.batched and rows != 1:
            raise ServingError("HYB-702", f"inference request to model {self.model!r} must specify batch-size 1 due "
                               "to requirements of sequence batcher", "send one row per request of a sequence")
        controls = self._control_feeds(flags)  # a string id to a numeric CORRID fails before the sequence starts
        now = self._clock()
        self._sweep(now)
        seq = self._live.get(flags.id)
        if seq is not None and self._idle(seq, now):
            del self._live[flags.id]
            seq = None
        if seq is None:
            if not flags.start:
                raise self._not_started(flags)
            seq = self._live[flags.id] = _Sequence(now)
        seq.pending += 1
        try:
            async with seq.lock:
                if flags.start:
                    seq.states, seq.ended = dict(self._initial), False
                    self._live[flags.id] = seq
                elif seq.ended:  # an earlier request of it carried END
                    raise self._not_started(flags)
                feeds.update(controls)
                feeds.update(seq.states)
                outputs = await queue()
                seq.states = {inp: np.array(outputs[out]) for inp, out in self._pairs}  # not a view of the batch
                return {k: v for k, v in outputs.items() if k not in self._hidden} if self._hidden else outputs
        finally:
            seq.pending -= 1
            seq.last = self._clock()
            if flags.end:
                seq.ended = True
                if self._live.get(flags.id) is seq:
                    del self._live[flags.id]

    def lone_feeds(self, rows: int = 1) -> dict[str, np.ndarray]:
        """What the server feeds to ``rows`` sequences of one request each (id 1, started and ended): warm-up."""
        numeric = all(c.dtype != np.dtype(object) for c in self.settings.controls if c.kind == "CORRID")
        feeds = {**self._control_feeds(SequenceFlags(1 if numeric else "1", True, True)), **self._initial}
        if self.batched and rows != 1:
            feeds = {name: np.repeat(value, rows, axis=0) for name, value in feeds.items()}
        return feeds

    def _control_feeds(self, flags: SequenceFlags) -> dict[str, np.ndarray]:
        feeds = {}
        for control, false, true in self._controls:
            if control.kind == "CORRID":
                if isinstance(flags.id, str) and control.dtype != np.dtype(object):
                    raise ServingError("HYB-702", f"sequence id {flags.id!r} is a string, but model {self.model!r} "
                                       f"takes its correlation id as {control.dtype} (control input "
                                       f"{control.name!r})", "send an integer sequence_id")
                if control.dtype == np.dtype(object):
                    feeds[control.name] = np.full(self._shape, str(flags.id), control.dtype)
                    continue
                bounds = np.iinfo(control.dtype)
                if not bounds.min <= flags.id <= bounds.max:  # type: ignore[operator]  # an int here
                    raise ServingError("HYB-702", f"sequence id {flags.id} does not fit model {self.model!r}'s "
                                       f"correlation id, {control.dtype} (control input {control.name!r})",
                                       f"send a sequence_id in {bounds.min}..{bounds.max}")
                feeds[control.name] = np.full(self._shape, flags.id, control.dtype)
            else:
                on = {"START": flags.start, "END": flags.end, "READY": True}[control.kind]
                feeds[control.name] = true if on else false
        return feeds

    def _not_started(self, flags: SequenceFlags) -> ServingError:
        return ServingError("HYB-702", f"inference request for sequence {flags.id} to model {self.model!r} must "
                            "specify the START flag on the first request of the sequence", _HINT)

    def _idle(self, seq: _Sequence, now: float) -> bool:
        return seq.pending == 0 and now - seq.last > self.settings.idle_s

    def _sweep(self, now: float) -> None:
        """Release the sequences idle longer than the limit (at most once per idle period)."""
        if now - self._swept < self.settings.idle_s:
            return
        self._swept = now
        for key in [k for k, seq in self._live.items() if self._idle(seq, now)]:
            del self._live[key]


def visible_signature(signature: Signature, settings: SequenceSettings | None) -> Signature:
    """The model's signature as clients see it: without the inputs the server feeds and the hidden state outputs."""
    if settings is None:
        return signature
    hidden_in, hidden_out = settings.server_inputs, settings.hidden_outputs
    return replace(signature, inputs=tuple(s for s in signature.inputs if s.name not in hidden_in),
                   outputs=tuple(s for s in signature.outputs if s.name not in hidden_out))

