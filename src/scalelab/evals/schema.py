"""A JSON Schema validator for the subset the tool-call tasks use (jsonschema is not a dependency).

Supported keywords: type (one name or a list), required, properties, additionalProperties (boolean), enum,
items (one schema), minimum, maximum, minLength, maxLength, minItems, maxItems; description and title are
ignored. A schema with any other keyword is refused (SchemaError) rather than half-checked. Semantics follow
JSON Schema: booleans are not numbers, 3.0 is an integer, and a type mismatch stops further checks of that
value (one error per wrong value, not a cascade).
"""
from __future__ import annotations

from typing import Any, Callable

from scalelab.core import errors

SUPPORTED = frozenset({"type", "required", "properties", "additionalProperties", "enum", "items", "minimum",
                       "maximum", "minLength", "maxLength", "minItems", "maxItems", "description", "title"})


class SchemaError(errors.DataError, ValueError):
    """The schema itself uses something this validator does not implement."""


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: _is_number(v) and float(v).is_integer(),
    "number": _is_number,
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _type_errors(value: Any, schema: dict, path: str) -> list[str]:
    wanted = schema.get("type")
    if wanted is None:
        return []
    names = [wanted] if isinstance(wanted, str) else list(wanted)
    unknown = [n for n in names if n not in TYPES]
    if unknown:
        raise SchemaError(f"{path}: unknown type {unknown[0]!r}")
    if any(TYPES[n](value) for n in names):
        return []
    return [f"{path}: expected {' or '.join(names)}, got {type(value).__name__} {value!r}"[:200]]


def _bound_errors(value: Any, schema: dict, path: str) -> list[str]:
    errors = []
    if _is_number(value):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} is above the maximum {schema['maximum']}")
    sized = {str: ("minLength", "maxLength", "characters"), list: ("minItems", "maxItems", "items")}
    for kind, (low, high, unit) in sized.items():
        if isinstance(value, kind):
            if low in schema and len(value) < schema[low]:
                errors.append(f"{path}: {len(value)} {unit}, fewer than {schema[low]}")
            if high in schema and len(value) > schema[high]:
                errors.append(f"{path}: {len(value)} {unit}, more than {schema[high]}")
    return errors


def _object_errors(value: dict, schema: dict, path: str) -> list[str]:
    errors = [f"{path}: missing required property {name!r}" for name in schema.get("required", [])
              if name not in value]
    properties = schema.get("properties", {})
    for name, item in value.items():
        if name in properties:
            errors += validate(item, properties[name], f"{path}.{name}")
        elif schema.get("additionalProperties", True) is False:
            errors.append(f"{path}: unexpected property {name!r}")
    return errors


def validate(value: Any, schema: dict, path: str = "$") -> list[str]:
    """Every violation of `schema` by `value`, as "path: what is wrong"; [] when valid."""
    unsupported = sorted(set(schema) - SUPPORTED)
    if unsupported:
        raise SchemaError(f"{path}: unsupported schema keyword(s) {', '.join(unsupported)}")
    errors = _type_errors(value, schema, path)
    if errors:
        return errors
    if "enum" in schema and not any(value == e and type(value) is type(e) for e in schema["enum"]):
        return [f"{path}: {value!r} is not one of {schema['enum']}"]
    errors = _bound_errors(value, schema, path)
    if isinstance(value, dict):
        errors += _object_errors(value, schema, path)
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += validate(item, schema["items"], f"{path}[{i}]")
    return errors
