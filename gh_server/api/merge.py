"""How a write changes a nested object (`limits`, `success`, `customer`, `operator`): field by field.

The product documentation promises "only the fields you send change", and the SDK's nested types are
partial (`limits={"steps": 5}` is a whole, valid argument), so a nested object sent in a PATCH or a
batch update is merged into the stored one: a field sent with a value replaces that field, a field sent
as `null` is cleared (back to its default where it has one), and a field not sent stays. Values inside
a field (a customer's `facts` mapping) are replaced whole, so the stored facts are always a set that
someone sent as such.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel


def merge_nested(current: Mapping[str, Any] | None, sent: BaseModel, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """`current` with the fields the client set in `sent` applied; `defaults` fill cleared fields.

    A field whose default is absent from `defaults` is dropped when cleared (so a stored customer keeps
    only what was said about it). Fields the client did not send are left exactly as stored."""
    out = dict(current or {})
    for name in sent.model_fields_set:
        value = getattr(sent, name)
        if value is None:
            if name in defaults:
                out[name] = defaults[name]
            else:
                out.pop(name, None)
        else:
            out[name] = value.model_dump() if isinstance(value, BaseModel) else _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v.model_dump() if isinstance(v, BaseModel) else v for k, v in value.items()}
    if isinstance(value, list):
        return [v.model_dump() if isinstance(v, BaseModel) else v for v in value]
    return value
