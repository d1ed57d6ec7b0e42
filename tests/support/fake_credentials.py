"""A corpus of fake credentials in the forms real ones take, built from random characters at run time.

Nothing here is a real secret, and no secret-looking text is committed: every value is drawn from
a seeded random generator in the shape its provider documents (prefix, alphabet, length), then
set in the syntax it is found in (an .env file, curl, YAML, a notebook's JSON, .npmrc, ...).
`fake_credentials(seed)` returns the forms; each names the rule expected to redact it and the
secret text that must never reach a corpus. Used by tests/corpus and benchmarks/redaction_quality.py.
"""

from __future__ import annotations

import base64
import json
import random
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass

LOWER, UPPER, DIGITS = string.ascii_lowercase, string.ascii_uppercase, string.digits
ALNUM = LOWER + UPPER + DIGITS
HEX = DIGITS + "abcdef"
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"
PASSWORD = ALNUM + "!#%*-_."
# Random text that a placeholder check would rightly skip: not drawn, so any seed gives real-looking values.
PLACEHOLDER_PARTS = ("your", "example", "placeholder", "redacted", "changeme", "dummy", "xxxx")


@dataclass(frozen=True)
class FakeCredential:
    """One credential form: where it is found, the text of the file, and the secret in it."""

    provider: str
    rule: str  # the redaction rule expected to take it
    syntax: str  # what kind of text it sits in
    filename: str  # a file name such text has
    text: str
    secret: str  # never in the corpus (nor any of `parts`)
    parts: tuple[str, ...] = ()  # further pieces of a secret split over lines (a PEM body)


class Draw:
    """Random values in the shapes providers document."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def chars(self, alphabet: str, count: int) -> str:
        """`count` characters of the alphabet, with a letter and a digit when it has both."""
        while True:
            value = "".join(self.rng.choice(alphabet) for _ in range(count))
            both = any(c in DIGITS for c in alphabet) and any(c.isalpha() for c in alphabet)
            mixed = not both or (any(c in DIGITS for c in value) and any(c.isalpha() for c in value))
            if mixed and value[0].isalnum() and not any(p in value.lower() for p in PLACEHOLDER_PARTS):
                return value

    def alnum(self, count: int) -> str:
        return self.chars(ALNUM, count)

    def hex(self, count: int) -> str:
        return self.chars(HEX, count)

    def password(self) -> str:
        return self.chars(PASSWORD, self.rng.randint(12, 20))

    def uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def b64(self, raw_bytes: int) -> str:
        return base64.b64encode(self.rng.randbytes(raw_bytes)).decode()

    def pem_body(self, lines: int) -> list[str]:
        return [self.chars(B64, 64) for _ in range(lines)]


Form = Callable[[Draw], FakeCredential]


def form(
    provider: str, rule: str, syntax: str, filename: str, template: str, value: Callable[[Draw], str]
) -> Form:
    """A form whose text is a template with one secret, `{s}`."""

    def make(draw: Draw) -> FakeCredential:
        secret = value(draw)
        return FakeCredential(provider, rule, syntax, filename, template.replace("{s}", secret), secret)

    return make


def aws_secret(d: Draw) -> str:
    return d.chars(B64, 40)


def pem_form(provider: str, syntax: str, filename: str, kind: str, indent: str = "", head: str = "") -> Form:
    """A private key block; with an indent it sits in a YAML block scalar under `head`."""

    def make(draw: Draw) -> FakeCredential:
        body = draw.pem_body(6)
        lines = [f"-----BEGIN {kind}PRIVATE KEY-----", *body, f"-----END {kind}PRIVATE KEY-----"]
        text = head + "".join(f"{indent}{line}\n" for line in lines)
        return FakeCredential(provider, "private-key", syntax, filename, text, body[0], tuple(body[1:]))

    return make


def service_account(draw: Draw) -> FakeCredential:
    """A GCP service account key file: its private key, as a JSON string with \\n escapes."""
    body = draw.pem_body(5)
    pem = "-----BEGIN PRIVATE KEY-----\n" + "\n".join(body) + "\n-----END PRIVATE KEY-----\n"
    text = json.dumps({"type": "service_account", "project_id": "demo-project", "private_key": pem}, indent=2)
    return FakeCredential(
        "Google", "secret-assignment", "json", "service-account.json", text, body[0], tuple(body[1:])
    )


def notebook(provider: str, rule: str, syntax: str, lines: list[str], value: Callable[[Draw], str]) -> Form:
    """A Jupyter notebook whose code cell holds the secret: JSON-escaped source lines."""

    def make(draw: Draw) -> FakeCredential:
        secret = value(draw)
        cell = {
            "cell_type": "code",
            "metadata": {},
            "outputs": [],
            "execution_count": 1,
            "source": [line.replace("{s}", secret) for line in lines],
        }
        text = json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1)
        return FakeCredential(provider, rule, syntax, "analysis.ipynb", text + "\n", secret)

    return make


def docker_auth(d: Draw) -> str:
    return base64.b64encode(f"builder:{d.password()}".encode()).decode()


def sas_signature(d: Draw) -> str:
    return d.b64(32).replace("+", "%2B").replace("/", "%2F").replace("=", "%3D")


FORMS: tuple[Form, ...] = (
    # AWS
    form(
        "AWS",
        "aws-access-key",
        "ini",
        "credentials",
        "[default]\naws_access_key_id = {s}\n",
        lambda d: "AKIA" + d.chars(UPPER + DIGITS, 16),
    ),
    form(
        "AWS",
        "aws-access-key",
        "json",
        "session.json",
        '{"AccessKeyId": "{s}", "Expiration": 0}\n',
        lambda d: "ASIA" + d.chars(UPPER + DIGITS, 16),
    ),
    form("AWS", "aws-secret-key", "ini", "credentials", "[prod]\naws_secret_access_key = {s}\n", aws_secret),
    form("AWS", "aws-secret-key", "env", ".env", "AWS_SECRET_ACCESS_KEY={s}\n", aws_secret),
    form(
        "AWS",
        "aws-secret-key",
        "json",
        "creds.json",
        '{\n  "SecretAccessKey": "{s}",\n  "Version": 1\n}\n',
        aws_secret,
    ),
    # GitHub
    form(
        "GitHub",
        "github-token",
        "python",
        "client.py",
        'headers = {"Authorization": "token {s}"}\n',
        lambda d: "ghp_" + d.alnum(36),
    ),
    form(
        "GitHub",
        "github-token",
        "env",
        ".env",
        "GH_TOKEN={s}\n",
        lambda d: "github_pat_" + d.alnum(22) + "_" + d.alnum(59),
    ),
    form(
        "GitHub",
        "github-token",
        "yaml",
        "hub.yml",
        "github.com:\n  oauth_token: {s}\n",
        lambda d: "gho_" + d.alnum(36),
    ),
    form(
        "GitHub",
        "github-token",
        "url",
        ".git-credentials",
        "https://x-access-token:{s}@github.com\n",
        lambda d: "ghs_" + d.alnum(36),
    ),
    # GitLab
    form(
        "GitLab",
        "gitlab-token",
        "curl",
        "release.sh",
        'curl --header "PRIVATE-TOKEN: {s}" https://gitlab.com/api/v4/projects\n',
        lambda d: "glpat-" + d.chars(B64URL, 20),
    ),
    form(
        "GitLab",
        "gitlab-token",
        "env",
        ".env",
        "GITLAB_TOKEN={s}\n",
        lambda d: "glpat-" + d.chars(B64URL, 20),
    ),
    # Slack
    form(
        "Slack",
        "slack-token",
        "python",
        "bot.py",
        'client = WebClient(token="{s}")\n',
        lambda d: f"xoxb-{d.chars(DIGITS, 12)}-{d.chars(DIGITS, 13)}-{d.alnum(24)}",
    ),
    form(
        "Slack",
        "slack-token",
        "yaml",
        "slack.yaml",
        "slack_user_token: {s}\n",
        lambda d: f"xoxp-{d.chars(DIGITS, 12)}-{d.chars(DIGITS, 12)}-{d.alnum(32)}",
    ),
    form(
        "Slack",
        "slack-webhook",
        "env",
        ".env",
        "SLACK_WEBHOOK_URL=https://hooks.slack.com/services/{s}\n",
        lambda d: f"T{d.chars(UPPER + DIGITS, 8)}/B{d.chars(UPPER + DIGITS, 10)}/{d.alnum(24)}",
    ),
    # Stripe
    form(
        "Stripe", "stripe-key", "env", ".env", "STRIPE_SECRET_KEY={s}\n", lambda d: "sk_live_" + d.alnum(99)
    ),
    form(
        "Stripe",
        "stripe-key",
        "javascript",
        "pay.js",
        "const stripe = require('stripe')('{s}');\n",
        lambda d: "rk_live_" + d.alnum(99),
    ),
    form(
        "Stripe",
        "stripe-webhook-secret",
        "env",
        ".env",
        "STRIPE_WEBHOOK_SECRET={s}\n",
        lambda d: "whsec_" + d.alnum(32),
    ),
    # OpenAI
    form(
        "OpenAI",
        "openai-key",
        "curl",
        "ask.sh",
        'curl https://api.openai.com/v1/chat/completions \\\n  -H "Authorization: Bearer {s}" \\\n'
        '  -H "Content-Type: application/json"\n',
        lambda d: "sk-proj-" + d.chars(B64URL, 156),
    ),
    form(
        "OpenAI",
        "openai-key",
        "python",
        "settings.py",
        'OPENAI_KEY = "{s}"\n',
        lambda d: "sk-" + d.alnum(20) + "T3BlbkFJ" + d.alnum(20),
    ),
    form(
        "OpenAI",
        "openai-key",
        "python",
        "chat.py",
        'openai.api_key = "{s}"\n',
        lambda d: "sk-svcacct-" + d.chars(B64URL, 120),
    ),
    form("OpenAI", "openai-key", "env", ".env", "OPENAI_API_KEY={s}\n", lambda d: "sk-" + d.alnum(48)),
    # Anthropic
    form(
        "Anthropic",
        "anthropic-key",
        "curl",
        "claude.sh",
        'curl https://api.anthropic.com/v1/messages \\\n  -H "x-api-key: {s}" \\\n'
        '  -H "anthropic-version: 2023-06-01"\n',
        lambda d: "sk-ant-api03-" + d.chars(B64URL, 93) + "AA",
    ),
    form(
        "Anthropic",
        "anthropic-key",
        "env",
        ".env",
        "ANTHROPIC_API_KEY={s}\n",
        lambda d: "sk-ant-api03-" + d.chars(B64URL, 93) + "AA",
    ),
    form(
        "Anthropic",
        "anthropic-key",
        "python",
        "agent.py",
        'client = anthropic.Anthropic(api_key="{s}")\n',
        lambda d: "sk-ant-admin01-" + d.chars(B64URL, 93) + "AA",
    ),
    # Hugging Face
    form(
        "HuggingFace",
        "huggingface-token",
        "env",
        ".env",
        "HF_TOKEN={s}\n",
        lambda d: "hf_" + d.chars(LOWER + UPPER, 34),
    ),
    form(
        "HuggingFace",
        "huggingface-token",
        "python",
        "upload.py",
        'login(token="{s}")\n',
        lambda d: "hf_" + d.chars(LOWER + UPPER, 34),
    ),
    notebook(
        "HuggingFace",
        "huggingface-token",
        "notebook",
        ["from huggingface_hub import login\n", 'login("{s}")\n'],
        lambda d: "hf_" + d.chars(LOWER + UPPER, 34),
    ),
    # Google / GCP
    form(
        "Google",
        "google-api-key",
        "javascript",
        "firebase.js",
        'const firebaseConfig = { apiKey: "{s}" };\n',
        lambda d: "AIza" + d.chars(B64URL, 35),
    ),
    form(
        "Google",
        "secret-assignment",
        "json",
        "service-account.json",
        '{\n  "type": "service_account",\n  "private_key_id": "{s}",\n  "client_id": "1234"\n}\n',
        lambda d: d.hex(40),
    ),
    service_account,
    form(
        "Google",
        "google-oauth",
        "json",
        "client_secret.json",
        '{"installed": {"client_secret": "{s}"}}\n',
        lambda d: "GOCSPX-" + d.chars(B64URL, 28),
    ),
    form(
        "Google",
        "google-oauth",
        "python",
        "drive.py",
        'creds = Credentials(token="{s}")\n',
        lambda d: "ya29.a0" + d.chars(B64URL, 120),
    ),
    # Azure
    form(
        "Azure",
        "secret-assignment",
        "connection-string",
        "appsettings.json",
        '{"Storage": "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey={s};'
        'EndpointSuffix=core.windows.net"}\n',
        lambda d: d.b64(64),
    ),
    form(
        "Azure",
        "secret-assignment",
        "connection-string",
        "local.settings.json",
        '{"Bus": "Endpoint=sb://acme.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;'
        'SharedAccessKey={s}"}\n',
        lambda d: d.b64(32),
    ),
    form(
        "Azure",
        "secret-assignment",
        "connection-string",
        "db.config",
        "Server=tcp:acme.database.windows.net,1433;Database=app;User ID=admin;Password={s};Encrypt=True;\n",
        lambda d: d.password(),
    ),
    form(
        "Azure",
        "azure-sas-signature",
        "url",
        "download.sh",
        "curl 'https://acme.blob.core.windows.net/c/data.csv?sv=2022-11-02&ss=b&srt=o&sp=r"
        "&se=2030-01-01T00:00:00Z&sig={s}'\n",
        sas_signature,
    ),
    form(
        "Azure",
        "azure-client-secret",
        "env",
        ".env",
        "AZURE_CLIENT_SECRET={s}\n",
        lambda d: d.alnum(3) + "8Q~" + d.chars(ALNUM + "_~.-", 34),
    ),
    # npm
    form(
        "npm",
        "npm-token",
        "npmrc",
        ".npmrc",
        "//registry.npmjs.org/:_authToken={s}\n",
        lambda d: "npm_" + d.alnum(36),
    ),
    form(
        "npm",
        "secret-assignment",
        "npmrc",
        ".npmrc",
        "@acme:registry=https://npm.pkg.github.com\n//npm.pkg.github.com/:_authToken={s}\n",
        lambda d: d.uuid(),
    ),
    form(
        "npm",
        "secret-assignment",
        "npmrc",
        ".npmrc",
        "registry=https://npm.acme.dev/\n_auth={s}\n",
        docker_auth,
    ),
    form("npm", "npm-token", "env", ".env", "NPM_TOKEN={s}\n", lambda d: "npm_" + d.alnum(36)),
    # PyPI
    form(
        "PyPI",
        "pypi-token",
        "ini",
        ".pypirc",
        "[pypi]\nusername = __token__\npassword = {s}\n",
        lambda d: "pypi-AgEIcHlwaS5vcmc" + d.chars(B64URL, 160),
    ),
    form(
        "PyPI",
        "pypi-token",
        "env",
        ".env",
        "TWINE_PASSWORD={s}\n",
        lambda d: "pypi-AgENdGVzdC5weXBpLm9yZw" + d.chars(B64URL, 160),
    ),
    # Twilio: the auth token and API secret have no prefix, so only their names give them away
    form(
        "Twilio",
        "secret-assignment",
        "env",
        ".env",
        "TWILIO_ACCOUNT_SID=AC" + "0" * 32 + "\nTWILIO_AUTH_TOKEN={s}\n",
        lambda d: d.hex(32),
    ),
    form(
        "Twilio",
        "secret-assignment",
        "yaml",
        "twilio.yml",
        "twilio:\n  api_secret: {s}\n",
        lambda d: d.alnum(32),
    ),
    # SendGrid
    form(
        "SendGrid",
        "sendgrid-key",
        "env",
        ".env",
        "SENDGRID_API_KEY={s}\n",
        lambda d: f"SG.{d.chars(B64URL, 22)}.{d.chars(B64URL, 43)}",
    ),
    form(
        "SendGrid",
        "sendgrid-key",
        "python",
        "mail.py",
        'sg = SendGridAPIClient("{s}")\n',
        lambda d: f"SG.{d.chars(B64URL, 22)}.{d.chars(B64URL, 43)}",
    ),
    # Mailgun
    form("Mailgun", "mailgun-key", "env", ".env", "MAILGUN_API_KEY={s}\n", lambda d: "key-" + d.hex(32)),
    form(
        "Mailgun",
        "mailgun-key",
        "python",
        "notify.py",
        'requests.post(url, auth=("api", "{s}"))\n',
        lambda d: "key-" + d.hex(32),
    ),
    # Shopify
    form(
        "Shopify",
        "shopify-token",
        "env",
        ".env",
        "SHOPIFY_ACCESS_TOKEN={s}\n",
        lambda d: "shpat_" + d.hex(32),
    ),
    form(
        "Shopify",
        "shopify-token",
        "yaml",
        "shopify.yml",
        "app:\n  shared_secret: {s}\n",
        lambda d: "shpss_" + d.hex(32),
    ),
    # DigitalOcean
    form(
        "DigitalOcean",
        "digitalocean-token",
        "env",
        ".env",
        "DIGITALOCEAN_TOKEN={s}\n",
        lambda d: "dop_v1_" + d.hex(64),
    ),
    form(
        "DigitalOcean",
        "digitalocean-token",
        "yaml",
        "config.yaml",
        "access-token: {s}\n",
        lambda d: "doo_v1_" + d.hex(64),
    ),
    # Databricks
    form(
        "Databricks",
        "databricks-token",
        "ini",
        ".databrickscfg",
        "[DEFAULT]\nhost = https://acme.cloud.databricks.com\ntoken = {s}\n",
        lambda d: "dapi" + d.hex(32),
    ),
    form(
        "Databricks",
        "databricks-token",
        "env",
        ".env",
        "DATABRICKS_TOKEN={s}\n",
        lambda d: "dapi" + d.hex(32) + "-2",
    ),
    # JWTs and Authorization headers
    form(
        "JWT",
        "jwt",
        "http",
        "request.http",
        "GET /me HTTP/1.1\nCookie: session={s}\n",
        lambda d: f"eyJ{d.chars(B64URL, 20)}.eyJ{d.chars(B64URL, 40)}.{d.chars(B64URL, 43)}",
    ),
    form(
        "JWT",
        "jwt",
        "http",
        "request.http",
        "GET /me HTTP/1.1\nAuthorization: Bearer {s}\n",
        lambda d: f"eyJ{d.chars(B64URL, 20)}.eyJ{d.chars(B64URL, 40)}.{d.chars(B64URL, 43)}",
    ),
    form(
        "HTTP",
        "authorization",
        "curl",
        "fetch.sh",
        'curl -H "Authorization: Basic {s}" https://api.acme.dev\n',
        lambda d: base64.b64encode(f"ops:{d.password()}".encode()).decode(),
    ),
    form(
        "HTTP",
        "authorization",
        "python",
        "api.py",
        'headers = {"Authorization": "Bearer {s}"}\n',
        lambda d: d.alnum(40),
    ),
    form("Gitea", "authorization", "http", "api.http", "Authorization: token {s}\n", lambda d: d.hex(40)),
    form(
        "Discord",
        "authorization",
        "javascript",
        "bot.js",
        "headers: { 'Authorization': 'Bot {s}' },\n",
        lambda d: f"{d.alnum(24)}.{d.chars(B64URL, 6)}.{d.chars(B64URL, 38)}",
    ),
    form(
        "HTTP", "bearer-token", "python", "client.py", 'AUTH_HEADER = "Bearer {s}"\n', lambda d: d.alnum(40)
    ),
    # Private keys
    pem_form("SSH", "pem", "id_rsa", "RSA "),
    pem_form("SSH", "pem", "id_ed25519", "OPENSSH "),
    pem_form("TLS", "yaml-block", "tls.yaml", "EC ", indent="    ", head="tls:\n  key: |\n"),
    # Frameworks, databases and tools, by name or URL
    form("Rails", "secret-assignment", "env", ".env", "SECRET_KEY_BASE={s}\n", lambda d: d.hex(128)),
    form(
        "Django",
        "secret-assignment",
        "python",
        "settings.py",
        "SECRET_KEY = '{s}'\n",
        lambda d: "django-insecure-" + d.password(),
    ),
    form(
        "Redis",
        "url-credentials",
        "env",
        ".env",
        "REDIS_URL=redis://:{s}@cache.internal:6379/0\n",
        lambda d: d.alnum(24),
    ),
    form(
        "PostgreSQL",
        "url-credentials",
        "env",
        ".env",
        "DATABASE_URL=postgresql://app:{s}@db.internal:5432/app\n",
        lambda d: d.alnum(20),
    ),
    form(
        "MongoDB",
        "url-credentials",
        "python",
        "db.py",
        'client = MongoClient("mongodb+srv://admin:{s}@cluster0.ab12c.mongodb.net/")\n',
        lambda d: d.alnum(16),
    ),
    form(
        "RabbitMQ",
        "url-credentials",
        "yaml",
        "broker.yaml",
        "broker_url: amqp://worker:{s}@mq:5672//\n",
        lambda d: d.alnum(16),
    ),
    form(
        "PostgreSQL",
        "secret-assignment",
        "shell",
        "backup.sh",
        "PGPASSWORD={s} pg_dump -h db app > app.sql\n",
        lambda d: d.alnum(18),
    ),
    form(
        "Docker",
        "secret-assignment",
        "json",
        "config.json",
        '{\n  "auths": {\n    "https://index.docker.io/v1/": {\n      "auth": "{s}"\n    }\n  }\n}\n',
        docker_auth,
    ),
    form(
        "Heroku",
        "netrc",
        "netrc",
        ".netrc",
        "machine api.heroku.com\n  login ops@acme.dev\n  password {s}\n",
        lambda d: d.uuid(),
    ),
    form(
        "Generic",
        "netrc",
        "netrc",
        ".netrc",
        "machine ftp.acme.dev login ops password {s}\n",
        lambda d: d.password(),
    ),
    form(
        "Generic",
        "secret-assignment",
        "yaml-block",
        "values.yaml",
        "db:\n  password: >-\n    {s}\n  port: 5432\n",
        lambda d: d.password(),
    ),
    form(
        "Generic",
        "secret-assignment",
        "yaml-block",
        "app.yaml",
        "oauth:\n  client_secret: |\n    {s}\n",
        lambda d: d.password(),
    ),
    notebook(
        "Generic",
        "secret-assignment",
        "notebook-json",
        ["config = {\n", '    "password": "{s}",\n', "}\n"],
        lambda d: d.password(),
    ),
    notebook(
        "Generic",
        "secret-assignment",
        "notebook",
        ['db_password = "{s}"\n', "connect(db_password)\n"],
        lambda d: d.password(),
    ),
    notebook(
        "Generic",
        "secret-assignment",
        "notebook-escaped-json",
        ['payload = "{\\"password\\": \\"{s}\\"}"\n'],
        lambda d: d.password(),
    ),
    form(
        "Generic",
        "secret-assignment",
        "toml",
        "config.toml",
        '[database]\nuser = "app"\npassword = "{s}"\n',
        lambda d: d.password(),
    ),
    form(
        "Generic",
        "secret-assignment",
        "toml",
        "pyproject.toml",
        '[tool.deploy]\napi_token = """{s}"""\n',
        lambda d: d.alnum(32),
    ),
    form(
        "Generic",
        "secret-assignment",
        "xml",
        "context.xml",
        '<Resource name="jdbc/app" username="app" password="{s}" />\n',
        lambda d: d.password(),
    ),
    form(
        "Generic",
        "secret-assignment",
        "xml",
        "web.config",
        '<appSettings>\n  <add key="StripeApiKey" value="{s}" />\n</appSettings>\n',
        lambda d: d.alnum(32),
    ),
    form(
        "Maven",
        "secret-assignment",
        "xml",
        "settings.xml",
        "<server>\n  <id>central</id>\n  <username>ci</username>\n  <password>{s}</password>\n</server>\n",
        lambda d: d.password(),
    ),
    form(
        "Generic",
        "secret-assignment",
        "ini",
        "app.ini",
        "[smtp]\nhost = mail.acme.dev\npassword={s}\n",
        lambda d: d.password(),
    ),
    form(
        "Generic", "secret-assignment", "shell", "deploy.sh", 'export DB_PASS="{s}"\n', lambda d: d.password()
    ),
    form("Generic", "secret-assignment", "go", "main.go", 'authToken := "{s}"\n', lambda d: d.alnum(32)),
)


def fake_credentials(seed: int = 20240601) -> list[FakeCredential]:
    """Every form with freshly drawn values (the same for the same seed)."""
    draw = Draw(seed)
    return [make(draw) for make in FORMS]


def secret_texts(credential: FakeCredential) -> list[str]:
    """What must not appear in a corpus: the secret and its parts, as written and as JSON escapes them."""
    pieces = [credential.secret, *credential.parts]
    return pieces + [json.dumps(piece)[1:-1] for piece in pieces]
