"""Provider token formats: the documented prefix and shape of each provider's keys and tokens.

Each format is a literal the token always holds (the pre-filter's trigger), where the token starts
relative to it, and a pattern for the whole token as the provider documents it (prefix, alphabet,
length). A match is a secret wherever it appears: in code, config, a header or a URL. Every length has
an upper bound, so that hostile input (a trigger repeated along a long line) costs linear time. secrets.py
turns these into rules; its docstring lists what the other rules (names, headers, URLs) cover.

  aws-access-key        AKIA/ASIA + 16 upper-case letters or digits (20 characters)
  github-token          ghp_/gho_/ghu_/ghs_/ghr_ + 36 or more; github_pat_ + 22 or more
  gitlab-token          glpat- + 20 or more
  slack-token           xoxa-/xoxb-/xoxp-/xoxo-/xoxr-/xoxs- + 10 or more
  slack-webhook         the secret path of https://hooks.slack.com/services/...
  google-api-key        AIza + 35 (39 characters)
  google-oauth          GOCSPX- + 28 (OAuth client secret); ya29. + 20 or more (access token)
  stripe-key            sk_live_/rk_live_ + 10 or more
  stripe-webhook-secret whsec_ + 32 or more
  anthropic-key         sk-ant-api03-... / sk-ant-admin01-... + 20 or more
  openai-key            sk-proj-/sk-svcacct-/sk-admin- + 20 or more; sk- + 20 + T3BlbkFJ + 20;
                        sk- + 32 or more letters and digits (also OpenAI-compatible APIs)
  huggingface-token     hf_ + 34 letters
  npm-token             npm_ + 36
  pypi-token            pypi-AgEI... / pypi-AgEN... (a macaroon) + 50 or more
  sendgrid-key          SG. + 22 + . + 43
  mailgun-key           key- + 32 hex
  shopify-token         shpat_/shpca_/shppa_/shpss_ + 32 hex
  digitalocean-token    dop_v1_/doo_v1_/dor_v1_ + 64 hex
  databricks-token      dapi + 32 hex (and an optional -N)
  azure-client-secret   3 characters, 8Q~, then 31 to 34 (Entra ID client secrets of the current
                        generation; older ones with another digit before Q~ are not covered)
  azure-sas-signature   the sig= of a shared access signature (20 or more)
  jwt                   three base64url parts: eyJ....eyJ....signature
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenFormat:
    """A provider's token: the literals it holds, where it starts relative to them, its documented shape."""

    name: str
    triggers: tuple[bytes, ...]
    pattern: re.Pattern[bytes]
    offset: int = 0  # where the token starts relative to the trigger
    word_start: bool = True  # the token may not continue a longer word


def token(
    name: str, triggers: tuple[bytes, ...], pattern: bytes, offset: int = 0, word_start: bool = True
) -> TokenFormat:
    """A format whose pattern may not be followed by more token characters."""
    return TokenFormat(name, triggers, re.compile(pattern + rb"(?![A-Za-z0-9_])"), offset, word_start)


TOKEN_FORMATS: tuple[TokenFormat, ...] = (
    token("aws-access-key", (b"AKIA", b"ASIA"), rb"(?:AKIA|ASIA)[A-Z0-9]{16}"),
    token(
        "github-token",
        (b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_", b"github_pat_"),
        rb"(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})",
    ),
    token("gitlab-token", (b"glpat-",), rb"glpat-[A-Za-z0-9_.-]{20,255}"),
    token("slack-token", (b"xox",), rb"xox[abposr]-[A-Za-z0-9-]{10,1024}"),
    TokenFormat(
        "slack-webhook",
        (b"hooks.slack.com",),
        re.compile(rb"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<secret>[A-Za-z0-9_/+-]{8,1024})"),
    ),
    TokenFormat("google-api-key", (b"AIza",), re.compile(rb"AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])")),
    TokenFormat(
        "google-oauth",
        (b"GOCSPX-", b"ya29."),
        re.compile(rb"(?:GOCSPX-[A-Za-z0-9_-]{28}|ya29\.[A-Za-z0-9_-]{20,1024})(?![A-Za-z0-9_-])"),
    ),
    token("stripe-key", (b"_live_",), rb"[sr]k_live_[0-9A-Za-z]{10,1024}", offset=-2),
    token("stripe-webhook-secret", (b"whsec_",), rb"whsec_[A-Za-z0-9+/]{32,1024}"),
    TokenFormat(
        "anthropic-key",
        (b"sk-",),
        re.compile(rb"sk-ant-(?:api|admin|oat|ort)[0-9]{2}-[A-Za-z0-9_-]{20,1024}(?![A-Za-z0-9_-])"),
    ),
    TokenFormat(
        "openai-key",
        (b"sk-",),
        re.compile(
            rb"sk-(?:(?:proj|svcacct|admin)-[A-Za-z0-9_-]{20,1024}|[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}"
            rb"|(?=[a-z]*[A-Z0-9])[A-Za-z0-9]{32,1024})(?![A-Za-z0-9_-])"
        ),
    ),
    token("huggingface-token", (b"hf_",), rb"hf_[A-Za-z]{34}"),
    token("npm-token", (b"npm_",), rb"npm_[A-Za-z0-9]{36}"),
    TokenFormat("pypi-token", (b"pypi-Ag",), re.compile(rb"pypi-Ag[A-Za-z0-9_-]{50,1024}(?![A-Za-z0-9_-])")),
    TokenFormat(
        "sendgrid-key",
        (b"SG.",),
        re.compile(rb"SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])"),
    ),
    token("mailgun-key", (b"key-",), rb"key-[0-9a-f]{32}"),
    token("shopify-token", (b"shp",), rb"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}"),
    token("digitalocean-token", (b"_v1_",), rb"do[por]_v1_[a-f0-9]{64}", offset=-3),
    TokenFormat(
        "databricks-token", (b"dapi",), re.compile(rb"dapi[a-f0-9]{32}(?:-[0-9]+)?(?![A-Za-z0-9_-])")
    ),
    TokenFormat(  # the trigger has the digit: a 2-byte trigger would slow the whole pre-filter down 3x
        "azure-client-secret",
        (b"8Q~",),
        re.compile(rb"[A-Za-z0-9_~.-]{3}8Q~[A-Za-z0-9_~.-]{31,34}(?![A-Za-z0-9_~.-])"),
        offset=-3,
    ),
    TokenFormat(
        "azure-sas-signature",
        (b"sig=",),
        re.compile(rb"sig=(?P<secret>[A-Za-z0-9%+/]{20,1024}(?:%3[Dd]|=){0,2})(?![A-Za-z0-9%+/=])"),
    ),
    TokenFormat(
        "jwt",
        (b"eyJ",),
        re.compile(rb"eyJ[A-Za-z0-9_-]{8,4096}\.eyJ[A-Za-z0-9_-]{8,4096}\.[A-Za-z0-9_-]{8,4096}"),
    ),
)
