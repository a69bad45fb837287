"""TLS test chains of chosen sizes: the certificate chain is most of a server's first flight.

A TLS server's first flight (ServerHello ... Finished) is itself a short transfer bounded by
the initial window: a classical 3-5 KB chain needs two rounds at IW3 and one at IW10, while
post-quantum signature chains (ML-DSA-65: a 1,952-byte public key and a 3,309-byte
signature per certificate) reach 10-20 KB and more. :func:`write_chain` writes a chain
whose DER bytes (leaf + intermediates: exactly what the server's Certificate message
carries) are ``chain_kb * 1000`` bytes, so the lab can measure handshakes of any size.

How a size is reached
    Every certificate (root, intermediates, leaf) has a real EC P-256 key, except a leaf of
    ``key_type="rsa"``; all signatures are real. The post-quantum bulk is a non-critical
    extension under a private OID (:data:`PADDING_OID`) holding random (incompressible, like
    ML-DSA keys and signatures) opaque bytes: verifiers skip unknown non-critical
    extensions, so the chain verifies everywhere while it is as large as wanted. The bytes
    are spread evenly over the certificates of the chain, as keys and signatures would be.
    Longer chains come from more intermediates (:func:`default_intermediates`).

Determinism
    Keys and serial numbers are random, but the sizes are not: serials always take 20
    bytes, ECDSA signatures are re-drawn until they have their longest DER form (72 bytes
    for P-256; about one in four draws), and each certificate's padding is solved for its
    exact target size. The same ``chain_kb`` and options give the same byte counts.

The root's and the intermediates' private keys are not written: nobody can issue more
certificates under a test root after the command ran.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

#: The padding extension's OID: under ``2.25`` (X.667: OIDs from UUIDs, no registration).
PADDING_OID = x509.ObjectIdentifier(f"2.25.{uuid.uuid5(uuid.NAMESPACE_URL, 'https://iwscope.test/oid/chain-padding').int}")
#: DER bytes of one certificate carrying an ML-DSA-65 public key and signature (1,952 +
#: 3,309 bytes plus about 350 of names, validity, extensions): one intermediate is added
#: per this many bytes of chain.
MLDSA65_CERT_BYTES = 5600
#: At most this many intermediates are chosen by default (more can be asked for).
MAX_DEFAULT_INTERMEDIATES = 4
#: Largest chain accepted: OpenSSL refuses a peer's certificate list above 100 KiB by
#: default (``SSL_CTX_set_max_cert_list``), and so would every client using it.
MAX_CHAIN_KB = 96.0
MIN_CHAIN_KB = 1.0
DEFAULT_NAME = "origin.iwscope.test"
DEFAULT_DAYS = 90
DEFAULT_RSA_BITS = 2048
#: Tries of an ECDSA signature for its longest DER form (each has a chance of about 1/4).
_SIGNATURE_TRIES = 200
#: Tries of a padding length for a certificate's exact size (DER length fields may grow).
_PADDING_TRIES = 8
#: About the bytes an empty padding extension takes (sequence, OID, two OCTET STRING headers).
_PADDING_HEADER_GUESS = 30


def tolerance_bytes(chain_kb: float) -> int:
    """How far a chain may miss ``chain_kb * 1000`` bytes: 10 % or 300 bytes, the larger."""
    return int(max(0.1 * chain_kb * 1000, 300))


def default_intermediates(chain_kb: float) -> int:
    """Intermediates for a chain of ``chain_kb``: one up to two ML-DSA-65-size certificates
    (a leaf and an intermediate, ~11 KB), then one more per :data:`MLDSA65_CERT_BYTES`, at
    most :data:`MAX_DEFAULT_INTERMEDIATES` (larger chains get larger certificates instead:
    the padding also stands in for SLH-DSA-size signatures)."""
    certificates = -(-int(chain_kb * 1000) // MLDSA65_CERT_BYTES)  # ceiling
    return max(1, min(MAX_DEFAULT_INTERMEDIATES, certificates - 1))


@dataclass(frozen=True)
class CertificateInfo:
    """One certificate of a written chain."""

    role: Literal["leaf", "intermediate", "root"]
    subject: str
    der_bytes: int
    #: Opaque bytes in the padding extension (0 when the certificate has none).
    padding_bytes: int


@dataclass(frozen=True)
class ChainInfo:
    """What :func:`write_chain` wrote."""

    chain_kb: float
    target_bytes: int
    #: DER bytes of the chain the server sends: leaf + intermediates (the root is not sent).
    chain_der_bytes: int
    #: Leaf first, then the intermediates up to the one the root signed.
    certificates: tuple[CertificateInfo, ...]
    root: CertificateInfo
    #: "ec" (P-256) or "rsa".
    key_type: str
    key_bits: int
    name: str
    ips: tuple[str, ...]
    chain_path: Path
    key_path: Path
    root_path: Path
    not_valid_before: datetime.datetime
    not_valid_after: datetime.datetime

    @property
    def intermediates(self) -> int:
        return len(self.certificates) - 1

    def to_json(self) -> dict[str, Any]:
        """The summary ``iwscope lab certs`` prints."""
        return {
            "chain_kb": self.chain_kb,
            "target_bytes": self.target_bytes,
            "chain_der_bytes": self.chain_der_bytes,
            "certificates": [vars(cert) for cert in self.certificates],
            "intermediates": self.intermediates,
            "root": vars(self.root),
            "key_type": self.key_type,
            "key_bits": self.key_bits,
            "name": self.name,
            "ips": list(self.ips),
            "not_valid_before": self.not_valid_before.isoformat(),
            "not_valid_after": self.not_valid_after.isoformat(),
            "files": {"chain": str(self.chain_path), "key": str(self.key_path), "root": str(self.root_path)},
        }


@dataclass(frozen=True)
class _Spec:
    """Everything of one certificate but its padding."""

    role: Literal["leaf", "intermediate", "root"]
    subject: x509.Name
    key: PrivateKey
    issuer: x509.Name
    issuer_key: PrivateKey
    extensions: tuple[tuple[x509.ExtensionType, bool], ...]


def _name(common_name: str) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "iwscope lab (test only)")]
    if len(common_name) <= 64:  # the X.520 upper bound of a common name
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _der_length(length: int) -> bytes:
    if length < 0x80:
        return bytes([length])
    body = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def _padding_extension(nbytes: int) -> x509.UnrecognizedExtension:
    """The stand-in for post-quantum keys and signatures: an OCTET STRING of random bytes."""
    return x509.UnrecognizedExtension(PADDING_OID, b"\x04" + _der_length(nbytes) + os.urandom(nbytes))


def _longest_signature_bytes(key: PrivateKey) -> int:
    if isinstance(key, rsa.RSAPrivateKey):
        return (key.key_size + 7) // 8
    # ECDSA-Sig-Value ::= SEQUENCE { r INTEGER, s INTEGER }, each at most one byte longer
    # than the curve's order (a leading zero when the top bit is set).
    integer = 2 + (key.curve.key_size + 7) // 8 + 1
    return 2 + 2 * integer


def _sign(spec: _Spec, padding_bytes: int, validity: tuple[datetime.datetime, datetime.datetime]) -> x509.Certificate:
    # 159 random bits with the top one set: always 20 DER bytes, positive, RFC 5280's maximum.
    serial = secrets.randbits(159) | (1 << 158)
    builder = (
        x509.CertificateBuilder()
        .subject_name(spec.subject)
        .issuer_name(spec.issuer)
        .public_key(spec.key.public_key())
        .serial_number(serial)
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
    )
    for extension, critical in spec.extensions:
        builder = builder.add_extension(extension, critical=critical)
    if padding_bytes:
        builder = builder.add_extension(_padding_extension(padding_bytes), critical=False)
    longest = _longest_signature_bytes(spec.issuer_key)
    for _ in range(_SIGNATURE_TRIES):
        certificate = builder.sign(spec.issuer_key, hashes.SHA256())
        if len(certificate.signature) == longest:
            return certificate
    raise RuntimeError(f"no {longest}-byte signature in {_SIGNATURE_TRIES} tries")


def _der_size(certificate: x509.Certificate) -> int:
    return len(certificate.public_bytes(serialization.Encoding.DER))


def _sign_to_size(
    spec: _Spec, target: int, validity: tuple[datetime.datetime, datetime.datetime]
) -> tuple[x509.Certificate, int]:
    """The certificate of ``spec`` closest to ``target`` DER bytes (not below its natural size)."""
    best = _sign(spec, 0, validity)
    best_padding = 0
    natural = _der_size(best)
    if target <= natural:
        return best, 0
    # The extension's own header (OID, OCTET STRING tags) takes some bytes: start below.
    padding = max(1, target - natural - _PADDING_HEADER_GUESS)
    for _ in range(_PADDING_TRIES):
        certificate = _sign(spec, padding, validity)
        size = _der_size(certificate)
        if abs(size - target) < abs(_der_size(best) - target):
            best, best_padding = certificate, padding
        if size == target:
            break
        padding = max(1, padding + target - size)
    return best, best_padding


def _ca_extensions(key: PrivateKey, issuer_key: PrivateKey | None) -> tuple[tuple[x509.ExtensionType, bool], ...]:
    extensions: list[tuple[x509.ExtensionType, bool]] = [
        (x509.BasicConstraints(ca=True, path_length=None), True),
        (
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            True,
        ),
        (x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False),
    ]
    if issuer_key is not None:
        extensions.append((x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False))
    return tuple(extensions)


def _leaf_extensions(
    key: PrivateKey, issuer_key: PrivateKey, name: str, ips: Sequence[ipaddress.IPv4Address | ipaddress.IPv6Address]
) -> tuple[tuple[x509.ExtensionType, bool], ...]:
    alt_names: list[x509.GeneralName] = [x509.DNSName(name)]
    alt_names += [x509.IPAddress(ip) for ip in ips]
    return (
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=isinstance(key, rsa.RSAPrivateKey),
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            True,
        ),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
        (x509.SubjectAlternativeName(alt_names), False),
        (x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False),
    )


def _ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@dataclass(frozen=True)
class BuiltChain:
    """A chain in memory: certificates (leaf first), the leaf's key and the root."""

    certificates: tuple[x509.Certificate, ...]
    padding: tuple[int, ...]
    leaf_key: PrivateKey
    root: x509.Certificate
    target_bytes: int

    @property
    def der_bytes(self) -> int:
        return sum(_der_size(certificate) for certificate in self.certificates)


def build_chain(
    chain_kb: float,
    *,
    intermediates: int | None = None,
    key_type: str = "ec",
    rsa_bits: int = DEFAULT_RSA_BITS,
    name: str = DEFAULT_NAME,
    ips: Sequence[str] = (),
    days: int = DEFAULT_DAYS,
    now: datetime.datetime | None = None,
) -> BuiltChain:
    """Issue a root, ``intermediates`` CAs and a leaf for ``name`` (and ``ips``) whose chain
    (leaf + intermediates, DER) is ``chain_kb * 1000`` bytes.

    Raises ``ValueError`` for a size out of range, or one smaller than the certificates
    without padding (by more than :func:`tolerance_bytes`).
    """
    if not MIN_CHAIN_KB <= chain_kb <= MAX_CHAIN_KB:
        raise ValueError(f"chain size {chain_kb:g} KB is outside {MIN_CHAIN_KB:g}-{MAX_CHAIN_KB:g} KB")
    if intermediates is None:
        intermediates = default_intermediates(chain_kb)
    if not 0 <= intermediates <= 8:
        raise ValueError("intermediates must be 0-8")
    if key_type == "rsa" and rsa_bits not in (2048, 3072, 4096):
        raise ValueError("RSA keys are 2048, 3072 or 4096 bits")
    if key_type not in ("ec", "rsa"):
        raise ValueError(f"unknown key type {key_type!r}")
    if days < 1:
        raise ValueError("days must be at least 1")
    addresses = [ipaddress.ip_address(ip) for ip in ips]
    start = (now or datetime.datetime.now(datetime.UTC)).replace(microsecond=0) - datetime.timedelta(days=1)
    validity = (start, start + datetime.timedelta(days=days + 1))

    root_key = _ec_key()
    root_name = _name("iwscope lab test root")
    root_spec = _Spec("root", root_name, root_key, root_name, root_key, _ca_extensions(root_key, None))
    root = _sign(root_spec, 0, validity)
    # Issuing order: root -> intermediate 1 -> ... -> intermediate N -> leaf.
    specs: list[_Spec] = []
    issuer_name, issuer_key = root_name, root_key
    for index in range(1, intermediates + 1):
        key = _ec_key()
        subject = _name(f"iwscope lab test intermediate {index}")
        specs.append(_Spec("intermediate", subject, key, issuer_name, issuer_key, _ca_extensions(key, issuer_key)))
        issuer_name, issuer_key = subject, key
    leaf_key: PrivateKey = rsa.generate_private_key(65537, rsa_bits) if key_type == "rsa" else _ec_key()
    specs.append(
        _Spec("leaf", _name(name), leaf_key, issuer_name, issuer_key, _leaf_extensions(leaf_key, issuer_key, name, addresses))
    )
    specs.reverse()  # chain order: leaf first

    target = round(chain_kb * 1000)
    natural = [_der_size(_sign(spec, 0, validity)) for spec in specs]
    spare = target - sum(natural)
    if spare < -tolerance_bytes(chain_kb):
        raise ValueError(
            f"a leaf and {intermediates} intermediate(s) take {sum(natural)} bytes without padding, "
            f"more than {chain_kb:g} KB allows: raise the size or lower --intermediates"
        )
    # Spread the padding evenly; the leaf takes the remainder.
    shares = [max(0, spare) // len(specs)] * len(specs)
    shares[0] += max(0, spare) - sum(shares)
    signed = [_sign_to_size(spec, size + share, validity) for spec, size, share in zip(specs, natural, shares, strict=True)]
    return BuiltChain(
        certificates=tuple(cert for cert, _ in signed),
        padding=tuple(pad for _, pad in signed),
        leaf_key=leaf_key,
        root=root,
        target_bytes=target,
    )


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # also when the file existed with another mode
        os.write(fd, data)
    finally:
        os.close(fd)


def _common_name(certificate: x509.Certificate) -> str:
    names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else certificate.subject.rfc4514_string()


def write_chain(
    out_dir: Path | str,
    chain_kb: float,
    *,
    intermediates: int | None = None,
    key_type: str = "ec",
    rsa_bits: int = DEFAULT_RSA_BITS,
    name: str = DEFAULT_NAME,
    ips: Sequence[str] = (),
    days: int = DEFAULT_DAYS,
) -> ChainInfo:
    """Write ``chain.pem`` (leaf, then intermediates: the server's Certificate message),
    ``key.pem`` (the leaf's key, PKCS#8, unencrypted, mode 0600) and ``root.pem`` (the trust
    anchor for clients) into ``out_dir`` (created when missing). See :func:`build_chain`."""
    built = build_chain(
        chain_kb, intermediates=intermediates, key_type=key_type, rsa_bits=rsa_bits, name=name, ips=ips, days=days
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    chain_path, key_path, root_path = out / "chain.pem", out / "key.pem", out / "root.pem"
    _write(
        key_path,
        built.leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        0o600,
    )
    _write(chain_path, b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in built.certificates), 0o644)
    _write(root_path, built.root.public_bytes(serialization.Encoding.PEM), 0o644)
    infos = tuple(
        CertificateInfo(
            role="leaf" if index == 0 else "intermediate",
            subject=_common_name(cert),
            der_bytes=_der_size(cert),
            padding_bytes=padding,
        )
        for index, (cert, padding) in enumerate(zip(built.certificates, built.padding, strict=True))
    )
    leaf = built.certificates[0]
    return ChainInfo(
        chain_kb=chain_kb,
        target_bytes=built.target_bytes,
        chain_der_bytes=built.der_bytes,
        certificates=infos,
        root=CertificateInfo(role="root", subject=_common_name(built.root), der_bytes=_der_size(built.root), padding_bytes=0),
        key_type=key_type,
        key_bits=built.leaf_key.key_size,
        name=name,
        ips=tuple(str(ip) for ip in ips),
        chain_path=chain_path,
        key_path=key_path,
        root_path=root_path,
        not_valid_before=leaf.not_valid_before_utc,
        not_valid_after=leaf.not_valid_after_utc,
    )


def write_self_signed(
    out_dir: Path | str, ips: Sequence[str], name: str = DEFAULT_NAME, days: int = DEFAULT_DAYS
) -> tuple[Path, Path]:
    """``cert.pem`` (one self-signed P-256 certificate, its own trust anchor) and ``key.pem`` in
    ``out_dir``: for servers whose TLS library refuses the test chains' padding extension (Go's
    before 1.22 rejects an OID arc beyond 64 bits, as under ``2.25``), e.g. Debian 12's Caddy."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    alternatives: list[x509.GeneralName] = [x509.DNSName(name), *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips)]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
        .sign(key, hashes.SHA256())
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out / "cert.pem", out / "key.pem"
    _write(
        key_path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        0o600,
    )
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert_path, key_path
