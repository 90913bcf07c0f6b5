"""The operators outside ATen that compiled code calls by name.

AOTInductor's compiled code calls an operator it has no kernel of its own for
(a custom operator) through the dispatcher, by name; the package lists those
calls in a JSON file beside the wrapper, and the runtime looks each operator
up when the package loads. The server has ATen's; any other must be
registered in its process: by a library loaded with --op_library, or, for an
operator defined in Python with torch.library.custom_op (as transformers
defines the grouped matmul of its mixture-of-experts layers on the CPU), by
importing the module that defines it. The manifest names each operator and
that module.
"""

from __future__ import annotations

import json
import warnings
import zipfile
from typing import Dict, Iterable, Tuple

_SERVER_NAMESPACES = ("aten", "prims")


def package_operators(package: str) -> Tuple[str, ...]:
    """The operators outside ATen that the compiled code in `package` calls,
    sorted ("namespace::name" or "namespace::name.overload")."""
    names = set()
    with zipfile.ZipFile(package) as archive:
        for entry in archive.namelist():
            if not entry.endswith(".json"):
                continue
            try:
                data = json.loads(archive.read(entry))
            except ValueError:
                continue
            nodes = data.get("nodes") if isinstance(data, dict) else None
            for node in nodes if isinstance(nodes, list) else []:
                target = node.get("node", {}).get("target") if isinstance(node, dict) else None
                if isinstance(target, str) and "::" in target and target.split("::")[0] not in _SERVER_NAMESPACES:
                    names.add(target)
    return tuple(sorted(names))


def python_module(name: str) -> str:
    """The importable module that defines operator `name` in Python
    (torch.library.custom_op); "" where there is none."""
    from torch._library import custom_ops  # noqa: PLC0415

    opdef = custom_ops.OPDEFS.get(name.split(".")[0])
    module = getattr(getattr(opdef, "_init_fn", None), "__module__", None) or ""
    return "" if module == "__main__" else module


def defining_modules(names: Iterable[str]) -> Dict[str, str]:
    """Each operator of `names`, sorted, and the module that defines it in
    Python ("" for none)."""
    return {name: python_module(name) for name in sorted(set(names))}


def manifest_operators(model: str, names: Iterable[str]) -> Dict[str, str]:
    """defining_modules, warning of the operators the server can get only
    from a library of its own (--op_library)."""
    operators = defining_modules(names)
    unimported = [name for name, module in operators.items() if not module]
    if unimported:
        warnings.warn(
            f"precompile capture: model '{model}': its compiled code calls {', '.join(unimported)}, "
            "which no importable Python module defines (an operator from a C++ library, or one "
            "defined in __main__): the server loads the model only with a library registering "
            "it (--op_library)", RuntimeWarning, stacklevel=3)
    return operators
