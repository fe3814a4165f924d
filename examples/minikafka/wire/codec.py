"""Frames, headers and payloads of the Kafka protocol, through ``kio``'s generated schemas."""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import typing
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

_API_KEY_VERSION_CORRELATION = struct.Struct(">hhi")
_LENGTH = struct.Struct(">i")


class MalformedRequest(ValueError):
    """A frame whose header or payload does not decode."""


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """``(api_key, api_version, correlation_id)``: the fixed start of every request header."""
    if len(frame) < _API_KEY_VERSION_CORRELATION.size:
        raise MalformedRequest(f"request of {len(frame)} bytes is shorter than its header")
    key, version, correlation = _API_KEY_VERSION_CORRELATION.unpack_from(frame)
    return key, version, correlation


def decode_request(frame: bytes, api_key: int, version: int) -> tuple[str | None, Any]:
    """``(client_id, request)``; trailing bytes are ignored as Java brokers do (librdkafka
    sends some after an all-topics Metadata request)."""
    schema = load_request_schema(api_key, version)
    try:
        header, offset = entity_reader(schema.__header_schema__)(frame, 0)
        body, _ = entity_reader(schema)(frame, offset)
    except Exception as exc:  # kio raises several types for short or inconsistent input
        raise MalformedRequest(f"cannot decode {schema.__name__} v{version}: {exc}") from exc
    return header.client_id, body


def encode_response(correlation_id: int, response: Any) -> bytes:
    """The length-prefixed response frame."""
    buffer = io.BytesIO()
    buffer.write(b"\0\0\0\0")
    header_schema = type(response).__header_schema__
    entity_writer(header_schema)(buffer, header_schema(correlation_id=correlation_id))
    entity_writer(type(response))(buffer, response)
    frame = buffer.getbuffer()
    _LENGTH.pack_into(frame, 0, len(frame) - 4)
    return bytes(frame)


def api_versions_error(correlation_id: int, error: int, table: list[tuple[int, int, int]]) -> bytes:
    """An ApiVersions error reply: always the v0 body, whatever version was asked, so that
    a client probing with a version this broker lacks can read it and retry lower."""
    item = nested(ApiVersionsResponseV0, "api_keys")
    versions = tuple(item(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in table)
    return encode_response(
        correlation_id, ApiVersionsResponseV0(error_code=ErrorCode(error), api_keys=versions)
    )


def request_schema(api_key: int, version: int) -> type[Any]:
    return load_request_schema(api_key, version)


def response_schema(api_key: int, version: int) -> type[Any]:
    return load_response_schema(api_key, version)


def seconds(duration: datetime.timedelta | int) -> float:
    """Seconds of a kio duration field (a timedelta) or of plain milliseconds."""
    if isinstance(duration, datetime.timedelta):
        return duration.total_seconds()
    return duration / 1000.0


def build(schema: Any, **fields: Any) -> Any:
    """``schema(**fields)`` without the fields this version of the schema lacks.

    Handlers fill in every field any version has; each version keeps its own. A field the
    version needs but ``fields`` lacks still fails, as it should.
    """
    names = _field_names(schema)
    return schema(**{name: value for name, value in fields.items() if name in names})


@cache
def _field_names(schema: Any) -> frozenset[str]:
    return frozenset(field.name for field in dataclasses.fields(schema))


def nested(schema: Any, name: str) -> type[Any]:
    """The dataclass of the items of ``schema.name`` (an array of structs or a struct)."""
    return _nested(schema, name)


@cache
def _nested(schema: Any, name: str) -> type[Any]:
    hint = typing.get_type_hints(schema)[name]
    todo = [hint]
    while todo:
        t = todo.pop()
        if dataclasses.is_dataclass(t) and isinstance(t, type):
            return t
        todo.extend(typing.get_args(t))
    raise TypeError(f"{schema.__name__}.{name} is not a struct or an array of structs")


__all__ = [
    "MalformedRequest",
    "api_versions_error",
    "build",
    "decode_request",
    "encode_response",
    "nested",
    "peek_header",
    "seconds",
]
