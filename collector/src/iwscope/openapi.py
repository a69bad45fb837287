"""The API's OpenAPI document, with the probe's wire schema inside it.

The batch uploads are validated against ``iwprobe/wire.schema.json`` (the one definition of
the wire format), not against pydantic models, so their request bodies are documented by
that schema: its ``$defs`` become ``components.schemas`` named ``wire.<Record>`` (OpenAPI
3.1 schemas are JSON Schema 2020-12, so they are taken as they are, only their internal
``$ref`` rewritten).  Swagger UI, client generators and the fuzzer then see the real
constraints instead of a reference to a document they cannot fetch.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from iwprobe import wire

#: Prefix of the wire format's records among ``components.schemas``.
WIRE_COMPONENT_PREFIX = "wire."


def wire_component_ref(record: str) -> str:
    """``$ref`` of a wire record (``TrialBatch``, ...) inside the OpenAPI document (that every
    reference resolves is tested on the published document)."""
    return f"#/components/schemas/{WIRE_COMPONENT_PREFIX}{record}"


def _rewrite_refs(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: (
                wire_component_ref(value.removeprefix("#/$defs/"))
                if key == "$ref" and isinstance(value, str) and value.startswith("#/$defs/")
                else _rewrite_refs(value)
            )
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_rewrite_refs(item) for item in node]
    return node


def wire_components() -> dict[str, Any]:
    """The wire schema's records as OpenAPI component schemas."""
    return {
        f"{WIRE_COMPONENT_PREFIX}{name}": _rewrite_refs(definition) for name, definition in wire.load_schema()["$defs"].items()
    }


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` include the wire records (built once, then cached by FastAPI)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                openapi_version=app.openapi_version,
                description=app.description,
                routes=app.routes,
            )
            document.setdefault("components", {}).setdefault("schemas", {}).update(wire_components())
            document["info"]["x-wire-version"] = wire.WIRE_VERSION
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
