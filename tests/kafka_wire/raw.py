"""A Kafka-protocol connection that sends what a test asks, well-formed or not."""

from __future__ import annotations

import io
import socket
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from minikafka.wire.codec import build

from .conftest import RunningBroker


class RawConnection:
    """One connection to broker ``node`` (or to a port); requests are answered one at a time."""

    def __init__(self, broker: RunningBroker | int, node: int = 0, timeout: float = 20) -> None:
        port = broker if isinstance(broker, int) else broker.wire.ports[node]
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            data += chunk
        return data

    def encode(self, api_key: int, version: int, **fields: Any) -> bytes:
        """The payload (header and body, no length prefix) of one request."""
        self.correlation += 1
        schema = load_request_schema(api_key, version)
        header_t = schema.__header_schema__
        buffer = io.BytesIO()
        header = build(
            header_t,
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=self.correlation,
            client_id="raw",
        )
        entity_writer(header_t)(buffer, header)
        entity_writer(schema)(buffer, build(schema, **fields))
        return buffer.getvalue()

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(len(payload).to_bytes(4, "big") + payload)

    def read_frame(self) -> bytes:
        return self._read(int.from_bytes(self._read(4), "big"))

    def decode(self, api_key: int, version: int, frame: bytes) -> Any:
        response_t = load_response_schema(api_key, version)
        response_header, offset = entity_reader(response_t.__header_schema__)(frame, 0)
        assert response_header.correlation_id == self.correlation
        body, _ = entity_reader(response_t)(frame, offset)
        return body

    def call(self, api_key: int, version: int, **fields: Any) -> Any:
        self.send_frame(self.encode(api_key, version, **fields))
        return self.decode(api_key, version, self.read_frame())

    def closed_by_peer(self) -> bool:
        """Whether the broker closed this connection (waits up to the socket's timeout)."""
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
