"""Certificates made for one test run with the machine's ``openssl``: never committed keys.

``make_test_pki(directory)`` writes a CA, a server certificate for 127.0.0.1 / localhost
signed by it, a client certificate signed by it, and a second CA nobody trusts (with a
"rogue" client certificate of its own); every key is a fresh EC P-256 key.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

# Long enough for any test run, short enough that a leaked file is soon worthless.
VALID_DAYS = "2"


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files ``make_test_pki`` wrote."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_ca_cert: Path
    rogue_client_cert: Path
    rogue_client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    completed = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    if completed.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {completed.stderr.strip()}")


def _key(name: str, cwd: Path) -> None:
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", name, cwd=cwd)


def _ca(prefix: str, cwd: Path) -> None:
    _key(f"{prefix}.key", cwd)
    _openssl("req", "-x509", "-new", "-key", f"{prefix}.key", "-sha256", "-days", VALID_DAYS,
             "-subj", f"/CN=tidemq test {prefix}", "-out", f"{prefix}.pem", cwd=cwd)


def _leaf(name: str, ca: str, extensions: str, cwd: Path) -> None:
    _key(f"{name}.key", cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", f"/CN=tidemq test {name}",
             "-out", f"{name}.csr", cwd=cwd)
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", VALID_DAYS, "-sha256", "-extfile", f"{name}.ext",
             "-out", f"{name}.pem", cwd=cwd)


def make_test_pki(directory: Path) -> Pki:
    """Write a fresh CA, server and client certificates into ``directory``."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make test certificates (apt-get install "
                    "openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    _ca("ca", directory)
    _ca("rogue-ca", directory)
    _leaf("server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
          "extendedKeyUsage=serverAuth\n", directory)
    _leaf("client", "ca", "extendedKeyUsage=clientAuth\n", directory)
    _leaf("rogue-client", "rogue-ca", "extendedKeyUsage=clientAuth\n", directory)
    return Pki(
        ca_cert=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        rogue_ca_cert=directory / "rogue-ca.pem",
        rogue_client_cert=directory / "rogue-client.pem",
        rogue_client_key=directory / "rogue-client.key",
    )
