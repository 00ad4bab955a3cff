"""Who gets which token: the issuance policy, applied after a request is well-formed.

Two kinds of caller:
- the app's backend, which shows a key of TOKEN_ISSUER_KEYS / TOKEN_ISSUER_KEYS_FILE as
  `Authorization: Bearer <key>` (the file is re-read when it changes: keys rotate without a
  restart). It has decided who its user is: any valid room and identity.
- anyone else (the page, a stranger): only rooms matching TOKEN_ROOMS and identities
  matching TOKEN_IDENTITIES (`*` any run of characters; by default any room and the page's
  own `web-*` identities, so `admin` is never handed to a stranger), and nothing at all
  with TOKEN_ANONYMOUS=false.
A wrong key is refused (401), never taken for "anonymous"; a refusal never holds a key.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from voice_keys import ApiKeys

from voice_token.settings import Settings
from voice_token.validation import RequestError, TokenRequest

HOW = "send `Authorization: Bearer <key>` with a key of TOKEN_ISSUER_KEYS"


@dataclass(frozen=True)
class GrantPolicy:
    keys: ApiKeys
    rooms: tuple[str, ...]
    identities: tuple[str, ...]
    anonymous: bool

    @classmethod
    def from_settings(cls, s: Settings) -> GrantPolicy:
        keys = ApiKeys(s.token_issuer_keys.get_secret_value(), s.token_issuer_keys_file,
                       file_setting="TOKEN_ISSUER_KEYS_FILE", how=HOW)
        return cls(keys, tuple(s.token_rooms), tuple(s.token_identities), s.token_anonymous)

    def check(self, req: TokenRequest, key: str | None) -> str:
        """Who the caller is ("issuer" or "anonymous"), or RequestError 401/403."""
        if key is not None:
            if self.keys.enabled and self.keys.allows(key):
                return "issuer"
            raise RequestError(self.keys.refusal(key) if self.keys.enabled else
                               "this service has no issuer keys (TOKEN_ISSUER_KEYS); send "
                               "no Authorization header", status=401)
        if not self.anonymous:
            raise RequestError(f"tokens are issued to the app's backend only: {HOW}",
                               status=401)
        if not any(fnmatchcase(req.room, p) for p in self.rooms):
            raise RequestError(f"room {req.room!r} is not open to anonymous callers "
                               f"(TOKEN_ROOMS: {', '.join(self.rooms)})", status=403,
                               field="room")
        if not any(fnmatchcase(req.identity, p) for p in self.identities):
            raise RequestError(f"identity {req.identity!r} is not one anonymous callers may "
                               f"have (TOKEN_IDENTITIES: {', '.join(self.identities)}); an "
                               f"app's backend may mint it: {HOW}", status=403,
                               field="identity")
        return "anonymous"
