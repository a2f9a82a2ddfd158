"""One line a user can act on for a failed call to the master.

gRPC says ``UNAVAILABLE`` both when nothing listens at the address and when a TLS handshake fails
(``Socket closed``: a plaintext client, or one without the client certificate an mTLS master requires);
the bare message names neither the address to check nor the flag to give.
"""

from __future__ import annotations

import grpc

from gradcode.common.transport.security import Security

__all__ = ["explain_rpc_error"]

NOTHING_ANSWERED = (
    "connection refused",
    "failed to connect to remote host",
    "domain name not found",
    "name or service not known",
    "dns resolution failed",
    "errors resolving",
    "no route to host",
    "network is unreachable",
    "timeout occurred",
    "deadline exceeded",
)
"""Parts of gRPC's details when no server took the connection at all."""

HANDSHAKE_FAILED = ("socket closed", "handshake", "ssl", "tls", "certificate", "connection reset", "end of tcp stream")
"""Parts of gRPC's details when a server took the connection and closed it during setup (TLS disagreement)."""


def explain_rpc_error(exc: grpc.RpcError, address: str, security: Security) -> str:
    """What went wrong calling the master at ``address`` with ``security``, and what to check."""
    code: grpc.StatusCode = exc.code()
    details = str(exc.details() or "")
    lowered = details.lower()
    if code == grpc.StatusCode.UNAVAILABLE and any(part in lowered for part in NOTHING_ANSWERED):
        return (
            f"nothing answered at {address} ({details}). Check that a master runs there and the address "
            "(--master or GRADCODE_MASTER; default 127.0.0.1:50050)."
        )
    if code == grpc.StatusCode.UNAVAILABLE and "wrong_version_number" in lowered:  # TLS client, plaintext server
        return (
            f"the master at {address} does not speak TLS ({details}). Drop --tls-ca/--tls (GRADCODE_TLS_CA, "
            "GRADCODE_TLS) for a plaintext master, or check that the port is the master's."
        )
    if code == grpc.StatusCode.UNAVAILABLE and any(part in lowered for part in HANDSHAKE_FAILED):
        return f"the master at {address} closed the connection during setup ({details}). {_tls_hint(security)}"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        hint = "give the master's client token with --token or GRADCODE_TOKEN."
        if security.token:
            hint = "check the token (--token or GRADCODE_TOKEN): the master did not accept it."
        return f"the master at {address} refused the call: UNAUTHENTICATED ({details}); {hint}"
    return f"the master answered {code.name}: {details}"


def _tls_hint(security: Security) -> str:
    """Which TLS setting to check, given what this client presented."""
    if not security.channel_tls:
        return (
            "It probably uses TLS: give the CA that signed its certificate with --tls-ca (GRADCODE_TLS_CA), and "
            "if it requires client certificates (mutual TLS) --tls-cert and --tls-key as well "
            "(`gradcode certs` makes them)."
        )
    if not security.mutual:
        return (
            "If it requires client certificates (GRADCODE_MTLS=1 on the master), give this client's certificate "
            "and key with --tls-cert/--tls-key and --mtls (GRADCODE_TLS_CERT, GRADCODE_TLS_KEY, GRADCODE_MTLS=1); "
            "otherwise check that --tls-ca is the CA that signed the master's certificate, that the certificate "
            "names the host you dial (or set --tls-server-name), and that the master uses TLS at all."
        )
    return (
        "Check that --tls-ca is the CA that signed the master's certificate, that your client certificate is "
        "signed by the CA the master trusts, that the master's certificate names the host you dial (or set "
        "--tls-server-name), and that the master uses TLS at all."
    )
