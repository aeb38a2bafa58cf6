"""Vconn addresses: "host:port" as the agent parses it, and a dial's host
resolved to IPs when the agent knows no node of that name (Go:
pkg/vconn/addr.go)."""

import socket

from .errors import BadRequestError, UnknownHostError


def split_addr(addr):
    """Parses "host:port" (port 1..65535; IPv6 hosts in brackets) as the
    agent does; the host may be empty."""
    host, sep, port = addr.rpartition(":")
    if not sep:
        raise BadRequestError(f"address {addr!r}: want host:port")
    if host.startswith("["):
        if not host.endswith("]"):
            raise BadRequestError(f"address {addr!r}: want host:port")
        host = host[1:-1]
    elif ":" in host:
        raise BadRequestError(f"address {addr!r}: too many colons (an IPv6 host goes in brackets)")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise BadRequestError(f"address {addr!r}: port {port!r}: want 1..65535")
    return host, int(port)


def join_addr(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def dial_addr(addr):
    host, port = split_addr(addr)
    if not host:
        raise BadRequestError(f"dial {addr!r}: no host")
    return host, port


def resolve(host, err):
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as e:
        raise UnknownHostError(f"{host}: no node of that name, and resolving it: {e}") from err
    ips = list(dict.fromkeys(i[4][0] for i in infos))
    if not ips:
        raise UnknownHostError(f"{host} resolves to no IP") from err
    return ips
