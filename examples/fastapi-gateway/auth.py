"""Who is calling: the API key's principal and the client's IP address."""

from __future__ import annotations

from starlette.requests import Request

from config import Principal, key_id


def authenticate(request: Request, api_keys: dict[str, Principal]) -> None:
    """Sets request.state.principal, .user_id, .tier and .key_id (the key's
    SHA-256) from the X-API-Key header; all None without a valid key. The
    raw key goes no further than this function."""
    raw = request.headers.get("x-api-key")
    kid = key_id(raw) if raw else None
    principal = api_keys.get(kid) if kid else None
    state = request.state
    state.principal = principal
    state.key_id = kid if principal else None
    state.user_id = principal.user_id if principal else None
    state.tier = principal.tier if principal else None
