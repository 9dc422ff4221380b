"""Signature inference: a function's annotations as a `FunctionSignature` (pure)."""

from __future__ import annotations

import inspect
import sys
import types
import typing
from collections.abc import Callable
from typing import Any

from lancefn_jupyter.kernel.packaging.capture import SUPPORTED_TYPES, PackagingError, describe, literal_source
from lancefn_jupyter.wire import dataplane
from lancefn_jupyter.wire.models import FunctionOutput, FunctionParameter, FunctionSignature

# --------------------------------------------------------------------------
# signature inference


class _Unsupported(Exception):
    pass


def _arrow_type(annotation: Any) -> tuple[str, bool]:
    origin = typing.get_origin(annotation)
    union_type = getattr(types, "UnionType", None)
    if origin is typing.Union or (union_type is not None and origin is union_type):
        arguments = typing.get_args(annotation)
        non_none = [a for a in arguments if a is not type(None)]
        if len(non_none) != 1 or len(non_none) == len(arguments):
            raise _Unsupported(f"the union {_type_text(annotation)}")
        inner, _ = _arrow_type(non_none[0])
        return inner, True
    if annotation is bool:
        return "bool", False
    if annotation is int:
        return "int64", False
    if annotation is float:
        return "float64", False
    if annotation is str:
        return "utf8", False
    if annotation is bytes:
        return "binary", False
    if annotation is list or origin is list:
        arguments = typing.get_args(annotation)
        if len(arguments) != 1:
            raise _Unsupported("a list without its element type (write e.g. list[float])")
        item, item_nullable = _arrow_type(arguments[0])
        if item_nullable:
            raise _Unsupported("a list with nullable elements")
        if dataplane.is_data_type(item):
            raise _Unsupported(f"a list of {_type_text(arguments[0])} (use map() for one array per call)")
        return f"list<{item}>", False
    try:  # numpy / pyarrow annotations: the Arrow data plane's types
        data_type = dataplane.annotation_type(annotation)
    except dataplane.UnsupportedAnnotation as error:
        raise _Unsupported(str(error)) from None
    if data_type is not None:
        return data_type, False
    raise _Unsupported(_type_text(annotation))


def _type_text(annotation: Any) -> str:
    if isinstance(annotation, type) and typing.get_origin(annotation) is None:
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


def _type_hints(fn: Callable[..., Any], name: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:
        pass
    hints: dict[str, Any] = {}
    module_globals = getattr(fn, "__globals__", {})
    for key, annotation in getattr(fn, "__annotations__", {}).items():
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, dict(module_globals))
            except Exception as error:
                what = "the return type" if key == "return" else f"parameter {key!r}"
                raise PackagingError(
                    f"the annotation {annotation!r} of {what} of {name} cannot be "
                    f"resolved ({error}); use one of the supported types: {SUPPORTED_TYPES}"
                ) from None
        hints[key] = annotation
    return hints


def _check_parameter(parameter: inspect.Parameter, name: str) -> None:
    """Refuse what rows cannot fill: *args, **kwargs, positional-only, a non-literal default."""
    if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
        raise PackagingError(
            f"parameter '*{parameter.name}' of {name}: a GPU function takes one value "
            "per named parameter; replace *args with named, annotated parameters "
            f"(supported types: {SUPPORTED_TYPES})"
        )
    if parameter.kind is inspect.Parameter.VAR_KEYWORD:
        raise PackagingError(
            f"parameter '**{parameter.name}' of {name}: a GPU function takes one value "
            "per named parameter; replace **kwargs with named, annotated parameters "
            f"(supported types: {SUPPORTED_TYPES})"
        )
    if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
        raise PackagingError(
            f"parameter {parameter.name!r} of {name} is positional-only; rows are "
            "passed by parameter name, so remove the `/` from the signature"
        )
    if parameter.default is not inspect.Parameter.empty and (literal_source(parameter.default) is None):
        raise PackagingError(
            f"parameter {parameter.name!r} of {name} has a default that is not a literal "
            f"({describe(parameter.default)}); a default must be a literal such as None, "
            "a number, a string or a tuple/list/dict of them: use `= None` and compute "
            "the value inside the function"
        )


def _unannotated(name: str, missing: list[str], has_return: bool) -> PackagingError:
    """The refusal for missing annotations, naming each and an example."""
    parts = []
    if missing:
        noun = "parameter" if len(missing) == 1 else "parameters"
        listed = ", ".join(repr(m) for m in missing)
        parts.append(f"annotate {noun} {listed} of {name}, e.g. `{missing[0]}: float`")
    if not has_return:
        parts.append(
            ("and its" if parts else "annotate the")
            + " return type"
            + ("" if parts else f" of {name}")
            + " (e.g. `-> float`)"
        )
    return PackagingError(
        "a GPU function needs type annotations to infer its signature: "
        + ", ".join(parts)
        + f". Supported types: {SUPPORTED_TYPES}."
    )


def defines_call(cls: type) -> bool:
    """The class (or a base other than ``object``) defines ``__call__``: it can be a class entry."""
    return any("__call__" in vars(klass) for klass in cls.__mro__[:-1])


def _parameters_besides_self(method: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(method).parameters.values())[1:]
    except (TypeError, ValueError):
        return []  # a C-level method (from a compiled base): nothing to check


def check_class_entry(cls: type, where: str = "") -> None:
    """Refuse a class entry the worker cannot drive (docs/ARCHITECTURE.md, "Warm state": instantiated with no
    arguments, ``setup(self)`` once, ``__call__(self, …)`` per row, ``teardown(self)``)."""
    label = f"the class entry {cls.__name__!r}{where}"
    if inspect.iscoroutinefunction(cls.__call__):
        raise PackagingError(
            f"{label} has `async def __call__`; a GPU function entry must be a plain synchronous `def`"
        )
    try:
        init = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        init = []
    required = [p.name for p in init if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    unannotated = [p.name for p in init if p.annotation is p.empty]
    if required and unannotated:  # annotated, they are its initialization values (``_initialization``)
        raise PackagingError(
            f"{label} is instantiated with no arguments: give every __init__ parameter a default, or load "
            f"in setup() (__init__ needs {', '.join(repr(name) for name in required)}); or annotate every __init__ "
            "parameter (`factor: float`) to give the values per run: submit(x, init={...})"
        )
    for hook in ("setup", "teardown"):
        method = getattr(cls, hook, None)
        if method is None:
            continue
        if not callable(method):
            raise PackagingError(f"{label}: {hook} must be a method `def {hook}(self):`, got {describe(method)}")
        if inspect.iscoroutinefunction(method):
            raise PackagingError(f"{label} has `async def {hook}`; make it a plain `def {hook}(self):`")
        extra = _parameters_besides_self(method)
        if extra:
            raise PackagingError(
                f"{label}: {hook}() is called with no arguments besides self, but it takes "
                f"{', '.join(repr(p.name) for p in extra)}; write `def {hook}(self):`"
            )


# The batched forms (docs/ARCHITECTURE.md, "Batched functions"), listed in every refusal.
BATCHED_FORMS = (
    "list[T] (T any per-row type: a list of the rows' values), NDArray[dtype] (the rows stacked on axis 0), "
    "pyarrow.Array (the rows' values as one Arrow array), or pyarrow.RecordBatch as the only parameter "
    "(the rows' columns); the return: list[T], NDArray[dtype] or pyarrow.Array, one value per row"
)


def _batched_type(annotation: Any, *, is_return: bool) -> tuple[str, bool, str]:
    """(per-row arrow_type, nullable, form) of a batched parameter or return annotation."""
    np = sys.modules.get("numpy")
    pa = sys.modules.get("pyarrow")
    origin = typing.get_origin(annotation)
    if origin is list:
        arguments = typing.get_args(annotation)
        if len(arguments) == 1:
            item_type, nullable = _arrow_type(arguments[0])  # any per-row type, arrays included
            return item_type, nullable, "list"
    if np is not None and (annotation is np.ndarray or origin is np.ndarray):
        data_type = dataplane.annotation_type(annotation)
        assert data_type is not None
        return data_type, False, "ndarray"
    if pa is not None and isinstance(annotation, type):
        if issubclass(annotation, (pa.Array, pa.ChunkedArray)):
            return dataplane.VALUE_TYPE, True, "arrow"
        if issubclass(annotation, pa.RecordBatch) and not is_return:
            return dataplane.RECORD_BATCH_TYPE, False, "record_batch"
    raise _Unsupported(_type_text(annotation))


def _batched_signature(
    name: str, parameters: list[inspect.Parameter], hints: dict[str, Any]
) -> tuple[list[FunctionParameter], FunctionOutput]:
    inputs = []
    for parameter in parameters:
        try:
            arrow_type, nullable, form = _batched_type(hints[parameter.name], is_return=False)
        except _Unsupported as error:
            raise PackagingError(
                f"parameter {parameter.name!r} of batched {name} has an unsupported type ({error}); "
                f"a batched parameter is {BATCHED_FORMS}"
            ) from None
        if form == "record_batch" and len(parameters) != 1:
            raise PackagingError(
                f"parameter {parameter.name!r} of batched {name} is a pyarrow.RecordBatch beside other "
                f"parameters; a RecordBatch must be the only parameter. A batched parameter is {BATCHED_FORMS}"
            )
        default = None
        if parameter.default is not inspect.Parameter.empty:
            default = literal_source(parameter.default)
        inputs.append(
            FunctionParameter(name=parameter.name, arrow_type=arrow_type, nullable=nullable, default=default, form=form)
        )
    try:
        output_type, _, output_form = _batched_type(hints["return"], is_return=True)
    except _Unsupported as error:
        raise PackagingError(
            f"the return type of batched {name} is unsupported ({error}); a batched parameter is {BATCHED_FORMS}"
        ) from None
    return inputs, FunctionOutput(kind="scalar", arrow_type=output_type, nullable=False, form=output_form)


def infer_signature(fn: Callable[..., Any], *, batched: bool = False) -> FunctionSignature:
    """The Function signature from `fn`'s annotations (docs/ARCHITECTURE.md, "Function versions").

    For a class entry (`fn` a class with ``__call__``) it is ``__call__``'s, without ``self``.
    ``batched``: the entry takes a chunk's rows in one call; each parameter's type is then one row's,
    with its ``form`` (docs/ARCHITECTURE.md, "Batched functions").
    """
    name = getattr(fn, "__name__", repr(fn))
    initialization = _initialization(fn) if inspect.isclass(fn) else ()
    try:
        if inspect.isclass(fn):
            name = f"{name}.__call__"
            fn = fn.__call__  # the class's own, not type.__call__
            parameters = list(inspect.signature(fn).parameters.values())[1:]
        else:
            parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise PackagingError(f"cannot read the signature of {name}; define it with `def`") from None
    for parameter in parameters:
        _check_parameter(parameter, name)
    hints = _type_hints(fn, name)
    missing = [p.name for p in parameters if p.name not in hints]
    if missing or "return" not in hints:
        raise _unannotated(name, missing, "return" in hints)
    if batched:
        if not parameters:
            raise PackagingError(f"batched {name} takes no parameters; a batched parameter is {BATCHED_FORMS}")
        batched_inputs, output = _batched_signature(name, parameters, hints)
        return FunctionSignature(
            inputs=tuple(batched_inputs), output=output, batched=True, initialization=initialization
        )
    inputs = []
    for parameter in parameters:
        arrow_type, nullable = _parameter_type(parameter, hints, name)
        default = None
        if parameter.default is not inspect.Parameter.empty:
            default = literal_source(parameter.default)  # an optional input (models.py)
        inputs.append(FunctionParameter(name=parameter.name, arrow_type=arrow_type, nullable=nullable, default=default))
    try:
        output_type, output_nullable = _arrow_type(hints["return"])
    except _Unsupported as error:
        raise PackagingError(
            f"the return type of {name} is unsupported ({error}); supported types: "
            f"{SUPPORTED_TYPES} (the return value cannot be None)"
        ) from None
    if output_nullable:
        raise PackagingError(
            f"the return type of {name} is nullable ({_type_text(hints['return'])}); "
            "a GPU function must always return a value: remove Optional / `| None` "
            "from the return annotation"
        )
    return FunctionSignature(
        inputs=tuple(inputs),
        output=FunctionOutput(kind="scalar", arrow_type=output_type, nullable=False),
        initialization=initialization,
    )


def _initialization(cls: type) -> tuple[FunctionParameter, ...]:
    """A class entry's initialization fields (LanceDB 0.40's ``signature.initialization``): its ``__init__``
    parameters, when one of them has no default (a class whose ``__init__`` needs nothing has none, so its version
    ids are as before); a parameter with a default is nullable (left out, the default applies)."""
    try:
        parameters = list(inspect.signature(cls).parameters.values())
    except (TypeError, ValueError):
        return ()
    if not any(p.default is p.empty for p in parameters):
        return ()
    name = f"{cls.__name__}.__init__"
    hints = _type_hints(typing.cast(Any, cls).__init__, name)  # every parameter is annotated (check_class_entry)
    fields = []
    for parameter in parameters:
        arrow_type, nullable = _parameter_type(parameter, hints, name)
        optional = nullable or parameter.default is not parameter.empty
        fields.append(FunctionParameter(name=parameter.name, arrow_type=arrow_type, nullable=optional))
    return tuple(fields)


def _parameter_type(parameter: inspect.Parameter, hints: dict[str, Any], name: str) -> tuple[str, bool]:
    """(arrow_type, nullable) of an annotated parameter of ``name``; a PackagingError names an unsupported type."""
    try:
        return _arrow_type(hints[parameter.name])
    except _Unsupported as error:
        raise PackagingError(
            f"parameter {parameter.name!r} of {name} has an unsupported type ({error}); "
            f"supported types: {SUPPORTED_TYPES}"
        ) from None
