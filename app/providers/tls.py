"""One TLS context per process for the providers' HTTP clients (issue 44, P14).

httpx builds a new `ssl.SSLContext` for every client, and loading the CA bundle into it (`load_verify_locations`) costs
~50 ms: that was most of a fresh session's `open_session` (the Python API, each ACP session, `/model`). A context is
safe to share between clients, so the providers build theirs once per process, as httpx would (`SSL_CERT_FILE`, else
`SSL_CERT_DIR`, else certifi's bundle), and build a new one only when those variables change.
"""

from __future__ import annotations

import os
import ssl

import httpx

_contexts: dict[tuple[str | None, str | None], ssl.SSLContext] = {}


def shared_ssl_context() -> ssl.SSLContext:
    """The context httpx would build with `verify=True, trust_env=True`, built once per process and CA setting."""
    key = (os.environ.get("SSL_CERT_FILE") or None, os.environ.get("SSL_CERT_DIR") or None)
    context = _contexts.get(key)
    if context is None:
        context = _contexts[key] = httpx.create_ssl_context(verify=True, trust_env=True)
    return context
