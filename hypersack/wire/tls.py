"""Certificates of a HyperSack cluster, and the TLS credentials server, agents and clients
build from them.

The cluster has its own certificate authority (`hypersack certs init`). Every certificate
it issues names one identity in its subject: the common name is the node, user or server
name, and the organizational unit says which kind it is (`node`, `client` or `server`).
The server reads the kind from the certificate an agent presents: only a `node`
certificate makes an agent, and only for the node it names.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import socket
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hypersack.core.bounds import is_name
from hypersack.core.errors import AlreadyExists, InvalidInput

NODE, CLIENT, SERVER = "node", "client", "server"
KINDS = (NODE, CLIENT, SERVER)
ORGANIZATION = "HyperSack"
CA_DAYS = 3650
LEAF_DAYS = 365
BACKDATE_S = 300  # a certificate is valid from this long before it is issued
MAX_PEM_BYTES = 64 << 10


@dataclass(frozen=True)
class Identity:
    """Who a certificate names: its kind (node, client, server) and name."""

    kind: str
    name: str
    issued_at: float = field(default=0.0, compare=False)  # epoch seconds; 0: unknown


@dataclass(frozen=True)
class CertPaths:
    ca: Path
    cert: Path
    key: Path


# ----------------------------------------------------------------- issuing (hypersack certs)
def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write_private(path: Path, data: bytes, *, overwrite: bool = False) -> None:
    """Write a file readable by its owner only (0600), created so from the start."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise AlreadyExists(f"{path} exists; remove it first to replace it") from None
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def _write_public(path: Path, data: bytes, *, overwrite: bool = False) -> None:
    if path.exists() and not overwrite:
        raise AlreadyExists(f"{path} exists; remove it first to replace it")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o644)
    tmp.replace(path)


def _name(kind: str, name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                      x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, kind),
                      x509.NameAttribute(NameOID.COMMON_NAME, name)])


def ca_paths(directory: Path) -> tuple[Path, Path]:
    return directory / "ca.crt", directory / "ca.key"


def leaf_paths(directory: Path, kind: str, name: str) -> CertPaths:
    """Where `certs issue` writes: server.crt, nodes/NAME.crt, clients/NAME.crt (+ .key)."""
    if kind == SERVER:
        return CertPaths(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    sub = directory / ("nodes" if kind == NODE else "clients")
    return CertPaths(directory / "ca.crt", sub / f"{name}.crt", sub / f"{name}.key")


def init_ca(directory: Path, *, days: int = CA_DAYS) -> Path:
    """A new certificate authority in `directory` (made 0700): ca.key (0600), ca.crt."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    cert_path, key_path = ca_paths(directory)
    if key_path.exists() or cert_path.exists():
        raise AlreadyExists(f"{directory} has a certificate authority already (ca.crt, "
                            "ca.key); issue certificates with it, or use another directory")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                         x509.NameAttribute(NameOID.COMMON_NAME, "HyperSack cluster CA")])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(seconds=BACKDATE_S))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    write_private(key_path, _pem_key(key))
    _write_public(cert_path, _pem_cert(cert))
    return cert_path


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert_path, key_path = ca_paths(directory)
    if not key_path.is_file() or not cert_path.is_file():
        raise InvalidInput(f"{directory}: no certificate authority there (ca.crt and ca.key); "
                           "create one with `hypersack certs init`")
    cert = x509.load_pem_x509_certificate(read_pem(cert_path))
    key = serialization.load_pem_private_key(read_pem(key_path), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise InvalidInput(f"{key_path}: not a key that `hypersack certs init` made")
    return cert, key


def default_server_names() -> list[str]:
    host = socket.gethostname()
    names = ["localhost", "127.0.0.1", "::1", host]
    try:
        fqdn = socket.getfqdn()
    except OSError:
        fqdn = host
    return list(dict.fromkeys([*names, fqdn]))


# A node's certificate names it under a reserved domain (RFC 2606) that no agent ever
# dials, so it can serve the agent's /metrics but never pass for the server.
NODE_DOMAIN = "nodes.hypersack.invalid"


def node_server_name(node: str) -> str:
    """The name an agent's HTTPS metrics answer to (a scraper's `server_name`)."""
    return f"{node.lower()}.{NODE_DOMAIN}"


def _dns_label(name: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", name))


def issue(directory: Path, kind: str, name: str, *, alt_names: list[str] | None = None,
          days: int = LEAF_DAYS, overwrite: bool = False) -> CertPaths:
    """A key and a certificate for one node, client or server, signed by the CA there."""
    if kind not in KINDS:
        raise InvalidInput(f"unknown certificate kind {kind!r}; valid: {', '.join(KINDS)}")
    if not is_name(name):
        raise InvalidInput(f"{kind} name {name[:80]!r}: use letters, digits and _.:@+=-")
    if not 1 <= days <= 10 * 366:
        raise InvalidInput(f"--days {days}: expected 1 to 3660")
    ca_cert, ca_key = _load_ca(directory)
    paths = leaf_paths(directory, kind, name)
    paths.cert.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not overwrite and (paths.cert.exists() or paths.key.exists()):
        raise AlreadyExists(f"{paths.cert} exists; remove it (and its key) to issue again")
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    # A node's certificate also serves its agent's /metrics over HTTPS (named by the node).
    usages = {SERVER: [ExtendedKeyUsageOID.SERVER_AUTH],
              NODE: [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH],
              CLIENT: [ExtendedKeyUsageOID.CLIENT_AUTH]}[kind]
    builder = (x509.CertificateBuilder().subject_name(_name(kind, name))
               .issuer_name(ca_cert.subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(seconds=BACKDATE_S))
               .not_valid_after(now + datetime.timedelta(days=days))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
    sans: list[x509.GeneralName] = []
    default = {SERVER: [name], NODE: [node_server_name(name)] if _dns_label(name) else []}
    for alt in alt_names or default.get(kind, []):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(alt)))
        except ValueError:
            sans.append(x509.DNSName(alt))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    write_private(paths.key, _pem_key(key), overwrite=overwrite)
    _write_public(paths.cert, _pem_cert(cert), overwrite=overwrite)
    return paths


# ----------------------------------------------------------------- reading
def read_pem(path: Path) -> bytes:
    try:
        if path.stat().st_size > MAX_PEM_BYTES:
            raise InvalidInput(f"{path}: larger than {MAX_PEM_BYTES} bytes; not a PEM file")
        return path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror or exc}") from None


def read_key(path: Path) -> bytes:
    """A private key, refused when others than its owner may read it (like ssh does)."""
    data = read_pem(path)
    if path.stat().st_mode & 0o077:
        raise InvalidInput(f"{path}: a private key readable by others; chmod 600 it")
    return data


@lru_cache(maxsize=1024)
def identity_of(pem: bytes) -> Identity | None:
    """The identity a HyperSack certificate names, or None for a certificate that names
    none (no organizational unit of a known kind, or no usable common name)."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
        units = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    except (ValueError, TypeError):
        return None
    if len(units) != 1 or len(names) != 1:
        return None
    kind, name = str(units[0].value), str(names[0].value)
    if kind not in KINDS or not is_name(name):
        return None
    # `certs issue` dates a certificate BACKDATE_S before it is issued (clock skew).
    issued = cert.not_valid_before_utc.timestamp() + BACKDATE_S
    return Identity(kind, name, issued)


def certificate_identity(path: Path) -> Identity:
    ident = identity_of(read_pem(path))
    if ident is None:
        raise InvalidInput(f"{path}: not a certificate that names a HyperSack node, client or "
                           "server (issue one with `hypersack certs issue`)")
    return ident


def _certificates(path: Path) -> tuple[bytes, list[x509.Certificate]]:
    data = read_pem(path)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        certs = []
    if not certs:
        raise InvalidInput(f"{path}: not a PEM certificate")
    now = _now()
    for cert in certs:
        if cert.not_valid_after_utc < now:
            raise InvalidInput(f"{path}: the certificate for {cert.subject.rfc4514_string()} "
                               f"expired on {cert.not_valid_after_utc:%Y-%m-%d}; issue a new one")
    return data, certs


def checked(paths: CertPaths | tuple[Path, Path | None, Path | None]
            ) -> tuple[bytes, bytes | None, bytes | None]:
    """(CA, certificate, key) as PEM, checked before gRPC sees them, which would only say
    that it could not bind or connect: each file parses, no certificate has expired, the
    key is the certificate's, and the CA signed the certificate."""
    ca, cert, key = (paths.ca, paths.cert, paths.key) if isinstance(paths, CertPaths) else paths
    if (cert is None) != (key is None):
        raise InvalidInput("a certificate needs its key, and a key its certificate")
    ca_pem, cas = _certificates(ca)
    if cert is None or key is None:
        return ca_pem, None, None
    cert_pem, chain = _certificates(cert)
    key_pem = read_key(key)
    try:
        private = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise InvalidInput(f"{key}: not an unencrypted PEM private key") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if private.public_key().public_bytes(der, public) != \
            chain[0].public_key().public_bytes(der, public):
        raise InvalidInput(f"{key} is not the key of {cert}")
    if not any(_signed_by(chain[0], c) for c in cas):
        raise InvalidInput(f"{cert} was not signed by the CA in {ca}")
    return ca_pem, cert_pem, key_pem


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def server_credentials(paths: CertPaths, *, require_client_cert: bool) -> grpc.ServerCredentials:
    """TLS for a listening port; with `require_client_cert`, mutual TLS: a peer must
    present a certificate signed by the cluster's CA."""
    ca, cert, key = checked(paths)
    assert cert is not None and key is not None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                       require_client_auth=require_client_cert)


def channel_credentials(ca: Path, cert: Path | None = None,
                        key: Path | None = None) -> grpc.ChannelCredentials:
    """TLS to the server, verified against the cluster's CA; with a certificate and key,
    this side proves its own identity too (agents; clients on the mutual-TLS port)."""
    ca_pem, cert_pem, key_pem = checked((ca, cert, key))
    return grpc.ssl_channel_credentials(root_certificates=ca_pem, private_key=key_pem,
                                        certificate_chain=cert_pem)
