"""Certificates for the TLS tests, made with the openssl command: a CA, and a server
certificate it signs for the names and addresses asked for."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def _openssl(*args: str) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        pytest.fail("the openssl command is not installed: apt-get install -y openssl")
    subprocess.run([binary, *args], check=True, capture_output=True, timeout=60)


def make_ca(where: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA in ``where``: (certificate, key)."""
    cert, key = where / f"{name}.pem", where / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-days", "2", "-subj", f"/CN={name}",
        "-keyout", str(key), "-out", str(cert),
    )  # fmt: skip
    return cert, key


def make_certificate(
    where: Path, name: str, ca: tuple[Path, Path], names: list[str]
) -> tuple[Path, Path]:
    """A server certificate signed by ``ca`` for ``names`` (``DNS:localhost``,
    ``IP:127.0.0.1``): (certificate, key)."""
    cert, key, request = where / f"{name}.pem", where / f"{name}.key", where / f"{name}.csr"
    extensions = where / f"{name}.ext"
    extensions.write_text(f"subjectAltName={','.join(names)}\n")
    _openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-nodes", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(request),
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
        "-CAcreateserial", "-days", "2", "-extfile", str(extensions), "-out", str(cert),
    )  # fmt: skip
    return cert, key
