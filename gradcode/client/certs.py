"""``gradcode certs``: a private CA and the certificates a gradcode cluster needs, with ``cryptography``.

Writes into ``--out``:

* ``ca.pem`` / ``ca-key.pem`` — the cluster's CA (keep the key offline; only ``ca.pem`` is distributed);
* ``node.pem`` / ``node-key.pem`` — for the master and the workers: a server certificate whose SANs
  are the given hostnames and IP addresses, usable as a client certificate too (mutual TLS between
  master, workers and tree parents);
* ``client.pem`` / ``client-key.pem`` — for users of ``gradcode run`` and the SDK under mutual TLS.

Keys are ECDSA P-256, written with mode 0600. Needs the ``certs`` extra (``pip install 'gradcode[certs]'``).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CertificateSet", "make_certificates"]


@dataclass(frozen=True)
class CertificateSet:
    """Paths of the files :func:`make_certificates` wrote."""

    ca: Path
    ca_key: Path
    node: Path
    node_key: Path
    client: Path
    client_key: Path


def _crypto() -> Any:
    try:
        from cryptography import x509  # noqa: F401
    except ImportError:
        raise RuntimeError("gradcode certs needs the 'cryptography' package: pip install 'gradcode[certs]'.") from None
    import cryptography

    return cryptography


def _san(hosts: Sequence[str]) -> list[Any]:
    from cryptography import x509

    names: list[Any] = []
    for host in hosts:
        host = host.strip().strip("[]")
        if not host:
            continue
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if any(c.isspace() for c in host) or "/" in host:
                raise ValueError(f"{host!r} is neither an IP address nor a host name.") from None
            names.append(x509.DNSName(host))
    return names


def make_certificates(out: Path, hosts: Sequence[str], *, days: int = 365, overwrite: bool = False) -> CertificateSet:
    """Create a CA, a node certificate (SANs: ``hosts``) and a client certificate under ``out``.

    ValueError when ``hosts`` is empty or holds something that is not a host name or IP, or when a file
    exists and ``overwrite`` is false; RuntimeError without ``cryptography``.
    """
    _crypto()
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if days < 1:
        raise ValueError(f"--days must be >= 1, not {days}.")
    sans = _san(hosts)
    if not sans:
        raise ValueError("Give at least one --host (a name or IP address the servers are reached at).")
    files = CertificateSet(
        *(out / name for name in ("ca.pem", "ca-key.pem", "node.pem", "node-key.pem", "client.pem", "client-key.pem"))
    )
    existing = [str(p) for p in vars(files).values() if p.exists()]
    if existing and not overwrite:
        raise ValueError(f"{', '.join(existing)} already exist; pass --overwrite to replace them.")
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gradcode"),
                          x509.NameAttribute(NameOID.COMMON_NAME, common)])  # fmt: skip

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder().subject_name(name("gradcode cluster CA")).issuer_name(name("gradcode cluster CA"))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip

    def leaf(common: str, usages: list[Any], san: list[Any] | None) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder().subject_name(name(common)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )  # fmt: skip
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    node_cert, node_key = leaf(
        "gradcode node", [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], sans
    )
    client_cert, client_key = leaf("gradcode client", [ExtendedKeyUsageOID.CLIENT_AUTH], None)

    def write(path: Path, data: bytes, private: bool) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def key_bytes(key: Any) -> bytes:
        return bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))  # fmt: skip

    for path, cert in ((files.ca, ca_cert), (files.node, node_cert), (files.client, client_cert)):
        write(path, cert.public_bytes(serialization.Encoding.PEM), private=False)
    for path, key in ((files.ca_key, ca_key), (files.node_key, node_key), (files.client_key, client_key)):
        write(path, key_bytes(key), private=True)
    return files
