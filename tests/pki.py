"""Certificates made at test time with the openssl command: a CA, and
certificates it signs (PEM files named NAME.pem / NAME.key in one directory)."""
from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(d: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA (also usable as a self-signed server certificate):
    (NAME.pem, NAME.key)."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl(d, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.pem")
    return d / f"{name}.pem", d / f"{name}.key"


def make_signed(d: Path, name: str, ca: str, san: str) -> tuple[Path, Path]:
    """A certificate for subjectAltName `san` signed by the CA `ca` made in
    the same directory: (NAME.pem, NAME.key)."""
    _openssl(d, "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.csr")
    (d / f"{name}.ext").write_text(f"subjectAltName = {san}\n")
    _openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    return d / f"{name}.pem", d / f"{name}.key"
