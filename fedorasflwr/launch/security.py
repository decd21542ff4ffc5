"""TLS certificates and SuperNode authentication keys for a deployment.

Flower 1.41 (see ``flower-superlink --help`` / ``flower-supernode --help``):

- TLS: the SuperLink serves its one HTTP port (Fleet, Control and Runtime APIs) over
  HTTPS with ``--ssl-ca-certfile``, ``--ssl-certfile`` and ``--ssl-keyfile``; a
  SuperNode verifies it with ``--root-certificates <CA cert>``; ``flwr`` with
  ``root-certificates`` in the connection's ``$FLWR_HOME/config.toml`` table.
- SuperNode authentication: the SuperLink runs with ``--enable-supernode-auth`` (TLS
  required); each node's public key is registered with ``flwr supernode register
  <key.pub> <connection>``, and the node signs in with ``--auth-supernode-private-key``.
  Keys are NIST-curve EC keys in OpenSSH format (``ssh-keygen -t ecdsa -b 384``).

``make_tls_files`` and ``make_node_key`` make throwaway ones with `cryptography`, for
localhost runs and tests; on real machines use your own (docs/deployment.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["NodeKey", "TlsFiles", "make_node_key", "make_tls_files", "node_key"]


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a SuperLink's TLS: the CA certificate, its certificate and its key."""

    ca_cert: Path
    server_cert: Path
    server_key: Path

    def check(self) -> None:
        """Raise ``FileNotFoundError`` naming the first file that does not exist."""
        for name in ("ca_cert", "server_cert", "server_key"):
            path = getattr(self, name)
            if not Path(path).is_file():
                raise FileNotFoundError(f"TLS {name.replace('_', ' ')} {path}: no such file")


@dataclass(frozen=True)
class NodeKey:
    """A SuperNode's authentication key pair (OpenSSH format)."""

    private_key: Path
    public_key: Path


def make_tls_files(
    directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"), days: int = 2
) -> TlsFiles:
    """Write a throwaway CA and a SuperLink certificate it signs, valid for ``hosts``.

    Parameters
    ----------
    directory : Path
        Where ``ca.crt``, ``server.pem`` and ``server.key`` go (created if needed).
    hosts : tuple of str
        IP addresses and DNS names the SuperLink is reached by (subject alternative names).
    days : int, default 2
        Validity of both certificates.

    Returns
    -------
    TlsFiles
        The three files, to pass to `Deployment` (``tls=``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    end = start + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedorasflwr throwaway CA")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), start, end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .sign(ca_key, hashes.SHA384())
    )
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    server_cert = (
        _builder(server_name, ca_name, server_key.public_key(), start, end)
        .add_extension(x509.SubjectAlternativeName([_general_name(h) for h in hosts]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .sign(ca_key, hashes.SHA384())
    )
    files = TlsFiles(directory / "ca.crt", directory / "server.pem", directory / "server.key")
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(files.server_key, _pem(server_key))
    return files


def make_node_key(directory: Path, name: str) -> NodeKey:
    """Write a throwaway P-384 key pair ``<name>`` / ``<name>.pub`` (like ``ssh-keygen``)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private = directory / name
    _write_private(
        private,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ),
    )
    return node_key(private, directory)


def node_key(private_key: Path, directory: Path) -> NodeKey:
    """The key pair of an existing OpenSSH EC private key; its public key goes to
    ``directory/<name>.pub`` (Flower derives it the same way from the private key).

    Raises
    ------
    ValueError
        If the file is not an unencrypted OpenSSH EC private key.
    """
    try:
        key = serialization.load_ssh_private_key(Path(private_key).read_bytes(), None)
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"SuperNode key {private_key}: not an unencrypted OpenSSH private key ({error}); "
            "make one with: ssh-keygen -t ecdsa -b 384 -N '' -f <name>"
        ) from error
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(
            f"SuperNode key {private_key}: a {type(key).__name__}; Flower needs an EC key "
            "on a NIST curve (ssh-keygen -t ecdsa -b 384)"
        )
    directory.mkdir(parents=True, exist_ok=True)
    public = directory / f"{Path(private_key).name}.pub"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        + b"\n"
    )
    return NodeKey(Path(private_key), public)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    start: datetime.datetime,
    end: datetime.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write_private(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner only."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as sink:
        sink.write(data)
