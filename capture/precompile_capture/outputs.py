"""A frame's outputs: the leaves of its result as a pytree, named by their path.

Real models return structures: `transformers` returns `ModelOutput` (an
ordered dict and a dataclass), others return tuples, lists, dicts or their own
dataclasses. The runtime serves tensors by name, so the capture flattens a
result with torch's pytree (the flattening torch.export and AOTInductor use
for outputs) and names each leaf by its path: mapping keys, attribute names
and sequence indices joined by "." ("last_hidden_state",
"past_key_values.0.1"); an index at the top is "output<i>" and a lone tensor
is "output0". Leaves that are not tensors (None, ints, ...) stay in the list
(a compiled variant returns a value for each) but are not served.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Mapping, Optional, Tuple

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import TensorArgument

import precompile_eager

from .errors import PrecompileError

# The types output_schema made pytree nodes (dataclasses, a library's
# structures), in order.
registered_nodes: List[type] = []

# Non-tensor leaves a frame may return: they are recorded, not served.
_CONSTANT_TYPES = (type(None), bool, int, float, str)


@dataclasses.dataclass(frozen=True)
class Leaf:
    name: str
    is_tensor: bool
    python_type: str = ""  # For a leaf that is not a tensor: "NoneType", "int", ...


@dataclasses.dataclass(frozen=True)
class OutputSchema:
    """The leaves of a frame's result, in pytree order, and its spec in words."""

    leaves: Tuple[Leaf, ...]
    tree_spec: str
    # The pytree spec itself, to rebuild the result from its leaves (a Python
    # eager program's callers of the frame do).
    spec: Optional[pytree.TreeSpec] = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def tensor_names(self) -> Tuple[str, ...]:
        return tuple(leaf.name for leaf in self.leaves if leaf.is_tensor)

    def simple_structure(self) -> Optional[Tuple[bool, int]]:
        """(is_tuple, n) for a lone tensor or a flat tuple of tensors; else None."""
        if len(self.leaves) == 1 and self.leaves[0].is_tensor and self.tree_spec == "*":
            return (False, 1)
        names = [f"output{i}" for i in range(len(self.leaves))]
        if (
            self.leaves
            and all(leaf.is_tensor for leaf in self.leaves)
            and [leaf.name for leaf in self.leaves] == names
            and self.tree_spec.startswith("tuple(")
        ):
            return (True, len(self.leaves))
        return None

    def describe(self) -> str:
        parts = [
            leaf.name if leaf.is_tensor else f"{leaf.name} ({leaf.python_type}, not served)"
            for leaf in self.leaves
        ]
        return "[" + ", ".join(parts) + "]"


def _attribute_values(result: Any) -> List[Any]:
    """`result` and the values of its mapping entries (a ModelOutput's fields)."""
    values = [result]
    if isinstance(result, dict):
        values.extend(result.values())
    elif isinstance(result, (list, tuple)):
        values.extend(result)
    return values


def _register_dataclasses(value: Any) -> None:
    registered_nodes.extend(precompile_eager.register_dataclasses(value))


def _key_words(key: Any) -> str:
    if isinstance(key, pytree.MappingKey):
        return str(key.key)
    if isinstance(key, pytree.SequenceKey):
        return str(key.idx)
    if isinstance(key, pytree.GetAttrKey):
        return key.name
    return str(key).strip(".[]'\"")


def path_words(path: Tuple[Any, ...]) -> str:
    """A pytree path in words: its keys, attribute names and indices joined by "."."""
    return ".".join(_key_words(k) for k in path)


def _leaf_name(path: Tuple[Any, ...]) -> str:
    if not path:
        return "output0"
    words = path_words(path)
    return f"output{words}" if isinstance(path[0], pytree.SequenceKey) else words


def register_known_structures(value: Any) -> None:
    """Makes the structure `value` is a pytree node where its library says how."""
    if type(value) not in pytree.SUPPORTED_NODES:
        precompile_eager.register_known_structures(type(value))
        if type(value) in pytree.SUPPORTED_NODES:
            registered_nodes.append(type(value))


def _spec_words(spec: pytree.TreeSpec) -> str:
    if spec.is_leaf():
        return "*"
    children = ", ".join(_spec_words(c) for c in spec.children())
    return f"{getattr(spec.type, '__name__', str(spec.type))}({children})"


def _cache_hint(value: Any) -> str:
    if not type(value).__name__.endswith("Cache"):
        return ""
    return (" (a transformers cache other than DynamicCache and EncoderDecoderCache of key/value "
            "layers, which are served as their tensors: build the model with use_cache=False, "
            "or pass use_cache=False)")


def _unflattenable(value: Any, path: str = "") -> Tuple[str, Any]:
    """The path and value of the outermost part of `value` whose own
    flattening raises, looking into mappings, tuples and lists."""
    if isinstance(value, Mapping):
        children = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, (tuple, list)):
        children = [(str(i), v) for i, v in enumerate(value)]
    else:
        return path, value
    for key, child in children:
        try:
            pytree.tree_flatten(child)
        except Exception:  # noqa: BLE001
            return _unflattenable(child, f"{path}.{key}" if path else key)
    return path, value


def output_schema(frame: str, result: Any) -> OutputSchema:
    """The schema of `result`, or PrecompileError naming what cannot be served."""
    _register_dataclasses(result)
    for value in _attribute_values(result):
        register_known_structures(value)
    try:
        try:
            with_paths, spec = pytree.tree_flatten_with_path(result)
        except ValueError:
            # A node type registered without keys: name its leaves by position.
            leaves, spec = pytree.tree_flatten(result)
            with_paths = [((pytree.SequenceKey(i),), leaf) for i, leaf in enumerate(leaves)]
    except Exception as e:  # noqa: BLE001 - a library's flatten function raised
        # transformers' DynamicCache refuses to be taken apart when its
        # layers are other than key/value layers (Mamba's).
        name, culprit = _unflattenable(result)
        raise PrecompileError(
            f"frame '{frame}' returns a {type(culprit).__qualname__} at '{name or '(the output)'}' "
            f"that its library cannot take apart into tensors ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}){_cache_hint(culprit)}; return its "
            "tensors instead, or capture a wrapper that does") from e
    out: List[Leaf] = []
    names = set()
    for path, leaf in with_paths:
        name = _leaf_name(path)
        if isinstance(leaf, torch.Tensor):
            out.append(Leaf(name, True))
        elif isinstance(leaf, _CONSTANT_TYPES):
            out.append(Leaf(name, False, type(leaf).__name__))
        else:
            raise PrecompileError(
                f"frame '{frame}' returns a {type(leaf).__qualname__} at '{name}'{_cache_hint(leaf)}; a "
                "frame's outputs are tensors (with None, bool, int, float or str leaves, which "
                "are not served) in tuples, lists, dicts, dataclasses or other pytree nodes. "
                "Register the type as a pytree node (torch.utils._pytree.register_pytree_node), "
                "return its tensors instead, or capture a wrapper that does"
            )
        if name in names:
            raise PrecompileError(f"frame '{frame}': two outputs are both named '{name}'")
        names.add(name)
    if not any(leaf.is_tensor for leaf in out):
        raise PrecompileError(
            f"frame '{frame}' returns no tensor ({_spec_words(spec)}); a frame must return "
            "at least one tensor"
        )
    return OutputSchema(tuple(out), _spec_words(spec), spec)


def exported_leaf_kinds(ep: torch.export.ExportedProgram) -> Tuple[bool, ...]:
    """Per value the exported program returns: whether it is a tensor."""
    return tuple(
        isinstance(s.arg, TensorArgument)
        for s in ep.graph_signature.output_specs
        if s.kind.name == "USER_OUTPUT"
    )
