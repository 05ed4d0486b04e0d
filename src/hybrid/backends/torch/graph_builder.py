"""ONNX graph (onnx-ir) -> ``torch.fx.GraphModule``: one ``call_function`` per ONNX node.

Constants (initializers, Constant nodes, and every node whose inputs are all constants) are
evaluated once here, on the CPU, and become buffers of the module on the target device: weights live
on the device and a ``ConstantOfShape`` that generates weights never runs again.

On an accelerator, shape arithmetic stays on the host: ``Shape``/``Size`` outputs are host tensors,
nodes whose runtime inputs are all host values run on the host, and a host value is copied to the
device only where a device node consumes it. Reading a shape therefore never waits for the device.
"""

from __future__ import annotations

import operator
from typing import Any

import onnx_ir as ir
import torch
from torch import fx

from hybrid.backends.torch.lowering import Lowering, lookup, torch_dtype
from hybrid.errors import BackendError, first_line

__all__ = ["Unsupported", "build_module", "graph_opsets", "unsupported_reason"]

_SMALL = 1024  # elements: constants up to this size may feed host-side nodes


class Unsupported(Exception):
    """A node the lowering table cannot express (carries the reason)."""


def to_device(value: Any, device: torch.device) -> Any:
    """Copy a host value (tensor or list of tensors) to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, list):
        return [to_device(v, device) for v in value]
    return value


def make_list(*items: Any) -> list[Any]:
    """Pack values into a Python list (a constant sequence rebuilt from its buffers)."""
    return list(items)


def graph_opsets(graph: ir.Graph, model_opsets: dict[str, int] | None = None) -> dict[str, int]:
    """The opset imports that apply to ``graph``'s nodes."""
    opsets = dict(model_opsets or {})
    opsets.update(graph.opset_imports or {})
    return opsets


def _opset(node: ir.Node, opsets: dict[str, int]) -> int | None:
    if node.version is not None:
        return node.version
    domain = "" if node.domain == "ai.onnx" else node.domain
    return opsets.get(domain)


def unsupported_reason(node: ir.Node, opsets: dict[str, int], device_type: str = "cpu") -> str | None:
    """Why ``node`` cannot be lowered (None: it can). Reads the table only; runs nothing."""
    low = lookup(node.domain, node.op_type, _opset(node, opsets))
    if low is None:
        return f"no torch lowering for {node.domain or 'ai.onnx'}::{node.op_type}"
    extra = set(node.attributes) - low.attrs
    if extra:
        return f"attribute(s) {sorted(extra)} of {node.op_type} are not handled"
    for v in [*node.inputs, *node.outputs]:
        dt = v.dtype if v is not None else None
        if dt is None or dt == ir.DataType.UNDEFINED:
            continue
        if dt not in low.dtypes:
            return f"{node.op_type} on {dt.name} is not supported by the torch lowering"
        if device_type == "mps" and dt == ir.DataType.DOUBLE:
            return "mps has no float64"
    if low.check is not None:
        reason = low.check(node)
        if reason:
            return reason
    for attr in node.attributes.values():
        if attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
            graphs = [attr.value] if attr.type == ir.AttributeType.GRAPH else list(attr.value)
            for sub in graphs:
                for inner in sub:
                    reason = unsupported_reason(inner, graph_opsets(sub, opsets), device_type)
                    if reason:
                        return reason
    return None


def _tensor_value(t: ir.TensorProtocol) -> torch.Tensor:
    dtype = t.dtype
    arr = t.numpy()
    if dtype in (ir.DataType.BFLOAT16,):
        return torch.from_numpy(arr.view("int16").copy()).view(torch.bfloat16)
    if dtype.name.startswith("FLOAT8"):
        return torch.from_numpy(arr.view("uint8").copy()).view(torch_dtype(dtype))
    if arr.dtype == object or dtype == ir.DataType.STRING:
        raise Unsupported("string tensors have no torch dtype")
    try:
        torch_dtype(dtype)
    except KeyError as e:
        raise Unsupported(f"{dtype.name} tensors have no torch dtype") from e
    return torch.from_numpy(arr.copy())


def _attr_value(attr: ir.Attr) -> Any:
    kind = attr.type
    if kind == ir.AttributeType.TENSOR:
        return _tensor_value(attr.value)
    if kind == ir.AttributeType.TENSORS:
        return [_tensor_value(t) for t in attr.value]
    if kind in (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS):
        return list(attr.value)
    if kind in (ir.AttributeType.INT, ir.AttributeType.FLOAT, ir.AttributeType.STRING):
        return attr.value
    if kind in (ir.AttributeType.TYPE_PROTO, ir.AttributeType.TYPE_PROTOS):
        return None  # declared types (Optional, SequenceEmpty): the values carry their own
    raise Unsupported(f"attribute {attr.name!r} of type {kind.name} is not handled")


def _host_value(value: Any) -> Any:
    """A constant read on the host: small int tensors become Python lists (or scalars)."""
    if isinstance(value, torch.Tensor) and not value.is_floating_point() and value.numel() <= _SMALL:
        return value.tolist()
    return value


class _Builder:
    def __init__(self, graph: ir.Graph, opsets: dict[str, int], device: torch.device,
                 root: torch.nn.Module, prefix: str = "", outer: _Builder | None = None) -> None:
        self.graph = graph
        self.opsets = opsets
        self.device = device
        self.split = device.type != "cpu"
        self.root = root
        self.prefix = prefix
        self.outer = outer
        self.fx = fx.Graph()
        self.env: dict[str, fx.Node] = {}
        self.consts: dict[str, Any] = {}
        self.host: set[str] = set()
        self.captured: list[str] = []
        self._const_nodes: dict[tuple[str, bool], fx.Node] = {}
        self._moved: dict[str, fx.Node] = {}
        self._count = 0

    # ------------------------------------------------------------ values
    def _fresh(self, stem: str) -> str:
        self._count += 1
        return f"{self.prefix}{stem}{self._count}"

    def _const_node(self, name: str, on_host: bool) -> fx.Node:
        key = (name, on_host or not self.split)
        node = self._const_nodes.get(key)
        if node is not None:
            return node
        value = self.consts[name]
        node = self._emit_const(value, torch.device("cpu") if key[1] and self.split else self.device)
        self._const_nodes[key] = node
        return node

    def _emit_const(self, value: Any, device: torch.device) -> fx.Node:
        if isinstance(value, torch.Tensor):
            attr = self._fresh("c")
            self.root.register_buffer(attr, value.to(device), persistent=False)
            return self.fx.get_attr(attr)
        if isinstance(value, (list, tuple)):
            return self.fx.call_function(make_list, tuple(self._emit_const(v, device) for v in value))
        if value is None:
            raise Unsupported("an absent optional value cannot be emitted as a constant")
        raise Unsupported(f"constant of type {type(value).__name__} cannot be emitted")

    def _lookup_outer(self, name: str) -> bool:
        """Resolve a name a subgraph takes from an enclosing graph; True when found."""
        if self.outer is None:
            return False
        outer = self.outer
        if name in outer.consts:
            self.consts[name] = outer.consts[name]
            return True
        if name in outer.env or outer._lookup_outer(name):
            if name in outer.consts:
                self.consts[name] = outer.consts[name]
                return True
            self.captured.append(name)
            self.env[name] = self.fx.placeholder(self._fresh("outer"))
            if name in outer.host:
                self.host.add(name)
            return True
        return False

    def _known(self, name: str) -> bool:
        return name in self.consts or name in self.env or self._lookup_outer(name)

    def _runtime_arg(self, name: str, on_host: bool) -> fx.Node:
        node = self.env[name]
        if self.split and not on_host and name in self.host:
            moved = self._moved.get(name)
            if moved is None:
                moved = self._moved[name] = self.fx.call_function(to_device, (node, self.device))
            return moved
        return node

    # ------------------------------------------------------------ nodes
    def add_inputs(self) -> None:
        inits = self.graph.initializers
        for name, value in inits.items():
            if value.const_value is None:
                raise Unsupported(f"initializer {name!r} has no data")
            self.consts[name] = _tensor_value(value.const_value)
        for value in self.graph.inputs:
            if value.name not in inits:
                self.env[value.name] = self.fx.placeholder(self._fresh("in"))

    def add_node(self, node: ir.Node) -> None:
        low = lookup(node.domain, node.op_type, _opset(node, self.opsets))
        if low is None:
            raise Unsupported(f"no torch lowering for {node.domain or 'ai.onnx'}::{node.op_type}")
        reason = unsupported_reason(node, self.opsets, self.device.type)
        if reason:
            raise Unsupported(reason)
        kwargs = self._attributes(node, low)
        names = [v.name if v is not None and v.name else None for v in node.inputs]
        for name in names:
            if name is not None and not self._known(name):
                raise Unsupported(f"input {name!r} of node {node.name!r} is not defined before it")
        if low.n_outputs:
            kwargs["n_outputs"] = len(node.outputs)
        if node.op_type == "Constant" and not node.inputs:
            self._set_outputs(node, low.fn(**kwargs), const=True)
            return
        runtime = [n for n in names if n is not None and n not in self.consts]
        graph_kwargs = any(isinstance(v, tuple) for v in kwargs.values())
        if low.foldable and not runtime and not graph_kwargs:
            args = [None if n is None else self.consts[n] for n in names]
            args = [_host_value(a) if i in low.host_inputs else a for i, a in enumerate(args)]
            self._set_outputs(node, low.fn(*args, **kwargs), const=True)
            return
        on_host = self._on_host(low, names, runtime)
        args = []
        for i, name in enumerate(names):
            if name is None:
                args.append(None)
            elif name in self.consts:
                if i in low.host_inputs:
                    value = _host_value(self.consts[name])
                    args.append(value if not isinstance(value, torch.Tensor)
                                else self._const_node(name, True))
                else:
                    args.append(self._const_node(name, on_host))
            else:
                args.append(self._runtime_arg(name, on_host or i in low.host_inputs))
        kwargs = {k: self._attr_arg(v) for k, v in kwargs.items()}
        call = self.fx.call_function(low.fn, tuple(args), kwargs)
        self._set_outputs(node, call, const=False, on_host=on_host or low.shape_only)

    def _on_host(self, low: Lowering, names: list[str | None], runtime: list[str]) -> bool:
        if not self.split:
            return False
        if low.shape_only:
            return True
        data = [n for i, n in enumerate(names) if n is not None and i not in low.host_inputs]
        for name in data:
            if name in self.consts:
                value = self.consts[name]
                if isinstance(value, torch.Tensor) and value.numel() > _SMALL:
                    return False
            elif name not in self.host:
                return False
        return True

    def _attributes(self, node: ir.Node, low: Lowering) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        for name, attr in node.attributes.items():
            if name not in low.attrs:
                raise Unsupported(f"attribute {name!r} of {node.op_type} is not handled")
            if attr.type == ir.AttributeType.GRAPH:
                kwargs[name] = self._subgraph(attr.value)
                continue
            kwargs[name] = _attr_value(attr)
        return kwargs

    def _attr_arg(self, value: Any) -> Any:
        """A tensor attribute becomes a buffer (on the host: attributes are small) when a call is emitted."""
        if isinstance(value, torch.Tensor) or (isinstance(value, list) and value
                                                and isinstance(value[0], torch.Tensor)):
            key = self._fresh("attr")
            self.consts[key] = value
            return self._const_node(key, True)
        return value

    def _subgraph(self, graph: ir.Graph) -> tuple[fx.Node, list[fx.Node]]:
        """Lower a subgraph (If branch, Loop/Scan body) to a submodule of the root.

        Returns the submodule's ``get_attr`` node with the enclosing values the body reads, which the
        lowering passes after the body's own inputs.
        """
        sub = _Builder(graph, graph_opsets(graph, self.opsets), self.device, self.root,
                       prefix=self._fresh("g") + "_", outer=self)
        sub.add_inputs()
        for node in graph:
            sub.add_node(node)
        captured = sub.finish()
        attr = self._fresh("body")
        self.root.add_module(attr, fx.GraphModule(self.root, sub.fx))
        args = [self._runtime_arg(n, False) for n in captured]
        return self.fx.get_attr(attr), args

    def _set_outputs(self, node: ir.Node, result: Any, *, const: bool, on_host: bool = False) -> None:
        outputs = list(node.outputs)
        single = len(outputs) == 1
        for j, value in enumerate(outputs):
            if not value.name:
                continue
            if const:
                if isinstance(result, fx.Node):  # a constant folded through a graph call
                    raise Unsupported("internal: folded value is a graph node")
                item = result if single else result[j]
                self.consts[value.name] = _const_result(item, value)
            else:
                self.env[value.name] = result if single else self.fx.call_function(
                    operator.getitem, (result, j))
                if on_host:
                    self.host.add(value.name)

    def finish(self) -> list[str]:
        outs = []
        for value in self.graph.outputs:
            name = value.name
            if name in self.consts:
                outs.append(self._const_node(name, False))
            elif name in self.env or self._lookup_outer(name):
                if name in self.consts:
                    outs.append(self._const_node(name, False))
                else:
                    outs.append(self._runtime_arg(name, False))
            else:
                raise Unsupported(f"graph output {name!r} is never computed")
        self.fx.output(tuple(outs))
        return self.captured


def _const_result(item: Any, value: ir.Value) -> Any:
    """A folded output; ONNX declares its dtype, torch sometimes widens (keep ONNX's)."""
    if isinstance(item, torch.Tensor) and value.dtype is not None:
        try:
            want = torch_dtype(value.dtype)
        except KeyError:
            return item
        if item.dtype != want:
            return item.to(want)
    return item


def build_module(graph: ir.Graph, opsets: dict[str, int], device: torch.device,
                 model_name: str = "model") -> fx.GraphModule:
    """Lower ``graph`` to a torch.fx GraphModule on ``device``, folding what is constant.

    The module's ``forward`` takes the graph's non-initializer inputs positionally and returns a tuple
    of its outputs.

    Raises:
        BackendError: HYB-304 naming the node the lowering failed on.
    """
    root = torch.nn.Module()
    builder = _Builder(graph, opsets, device, root)
    current: ir.Node | None = None
    try:
        builder.add_inputs()
        for current in graph:
            builder.add_node(current)
        builder.finish()
    except Unsupported as e:
        where = f" at node {current.name!r} ({current.op_type})" if current is not None else ""
        raise BackendError("HYB-304", f"torch cannot lower model {model_name!r}{where}: {e}",
                           "try target='auto' so another backend runs it") from e
    except BackendError:
        raise
    except Exception as e:  # a lowering rejected constant inputs while folding
        where = f" at node {current.name!r} ({current.op_type})" if current is not None else ""
        first = first_line(e)
        raise BackendError("HYB-304", f"torch could not build model {model_name!r}{where}: {first}",
                           "try target='auto' so another backend runs it") from e
    return fx.GraphModule(root, builder.fx, class_name=f"Hybrid_{_ident(model_name)}")


def _ident(name: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in name)
    return out if out and not out[0].isdigit() else f"m_{out}"
