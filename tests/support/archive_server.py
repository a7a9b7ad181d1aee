"""A tiny HTTP server on 127.0.0.1 that serves dataset archives to the worker in tests, and
answers chosen paths with a chosen status, body and headers (an error page, a redirect)."""

from __future__ import annotations

import datetime
import http.server
import socket
import ssl
import tarfile
import threading
from pathlib import Path


class ArchiveServer:
    """Serves the files of one folder over HTTP on 127.0.0.1 and counts the requests (their
    paths in `requests`, their Host headers in `hosts`)."""

    def __init__(self, folder: Path, certificate: tuple[Path, Path] | None = None) -> None:
        """With `certificate` (its PEM file and its key's), it speaks https."""
        self.folder = folder
        self.scheme = "https" if certificate else "http"
        self.requests: list[str] = []
        self.hosts: list[str | None] = []
        self.answers: dict[str, tuple[int, bytes, dict[str, str]]] = {}
        server = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs) -> None:
                super().__init__(*args, directory=str(folder), **kwargs)

            def do_GET(self) -> None:
                server.requests.append(self.path)
                server.hosts.append(self.headers.get("Host"))
                answer = server.answers.get(self.path)
                if answer is None:
                    super().do_GET()
                    return
                status, body, headers = answer
                self.send_response(status)
                # An empty value leaves a header out (a body without Content-Length).
                for name, value in {"Content-Length": str(len(body)), **headers}.items():
                    if value:
                        self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if certificate is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*certificate)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def url(self, name: str, host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}/{name}"

    def answer(
        self, name: str, status: int, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> None:
        """Answer `/name` with `status`, `body` and `headers` instead of a file."""
        self.answers[f"/{name}"] = (status, body, dict(headers or {}))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def make_tgz(source: Path, archive: Path, top: str) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname=top)
    return archive


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make_certificate(folder: Path, name: str) -> tuple[Path, Path, Path]:
    """A certificate authority and a certificate it signed for `name`: (the authority's PEM,
    the certificate's PEM, its key's PEM), written in `folder`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "traindeck test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
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
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = (folder / "ca.pem", folder / "server.pem", folder / "server.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths
