"""Django settings for Proof, read from the environment (see .env.example).

Two shapes from one file:
- embedded default (no DATABASE_URL, no REDIS_URL): SQLite in PROOF_DATA_DIR, Celery tasks go
  to an in-process broker that the in-process runner (proof_web/runner.py) consumes, an
  in-memory channel layer. Everything works on one machine, nothing scales.
- production (DATABASE_URL and REDIS_URL set): PostgreSQL with row-level security, Redis as the
  Celery broker and the Channels layer, separate web / ingest / worker / beat processes.
"""

from __future__ import annotations

from pathlib import Path

import django_stubs_ext

from proof_web.env import (
    EnvError,
    env_bool,
    env_choice,
    env_database_url,
    env_float,
    env_int,
    env_list,
    env_optional,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# Django's admin and form classes take their model as a type parameter for mypy
# (`admin.ModelAdmin[Customer]`); this makes them subscriptable at run time too.
django_stubs_ext.monkeypatch()

PROOF_ENV = env_choice("PROOF_ENV", "development", ("development", "production", "test"))
IS_PRODUCTION = PROOF_ENV == "production"

_INSECURE_DEFAULT_KEY = "proof-insecure-development-key-do-not-use-in-production"
SECRET_KEY = env_str("PROOF_SECRET_KEY", _INSECURE_DEFAULT_KEY)
DEBUG = env_bool("PROOF_DEBUG", not IS_PRODUCTION)

if IS_PRODUCTION:
    if DEBUG:
        raise EnvError("PROOF_ENV=production refuses to start with PROOF_DEBUG on")
    if SECRET_KEY == _INSECURE_DEFAULT_KEY or len(SECRET_KEY) < 50:
        raise EnvError(
            "PROOF_ENV=production needs PROOF_SECRET_KEY set to a random value of 50+ characters"
        )

ALLOWED_HOSTS = env_list("PROOF_ALLOWED_HOSTS", [] if IS_PRODUCTION else ["*"])
if IS_PRODUCTION and not ALLOWED_HOSTS:
    raise EnvError("PROOF_ENV=production needs PROOF_ALLOWED_HOSTS (comma-separated host names)")
CSRF_TRUSTED_ORIGINS = env_list("PROOF_CSRF_TRUSTED_ORIGINS", [])

DATA_DIR = Path(env_str("PROOF_DATA_DIR", str(BASE_DIR / ".data"))).resolve()

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    # Swagger UI's JavaScript and CSS, served from Proof's own static files (no CDN).
    "drf_spectacular_sidecar",
    "channels",
    "proof_web",
    "tenants",
    "ingest",
    "investigations",
    "notify",
    "billing",
    "frontend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Content-Security-Policy on every response: scripts from this origin only (tenants/csp.py).
    "tenants.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "tenants.middleware.TenantContextMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "proof_web.urls"
WSGI_APPLICATION = "proof_web.wsgi.application"
ASGI_APPLICATION = "proof_web.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "tenants.context_processors.principal",
                # The past-due / paused / licence banner, from the cache (no query).
                "billing.context_processors.billing_banners",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
# DATABASE_URL is the application's role: not the owner of any table, no BYPASSRLS, so
# row-level security applies to every query it makes. DATABASE_OWNER_URL is the role that owns
# the schema; `manage.py migrate` uses it (proof_web/management/commands/migrate.py).
_app_db = env_database_url("DATABASE_URL")
_owner_db = env_database_url("DATABASE_OWNER_URL")

if _app_db is None:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    if _owner_db is not None:
        raise EnvError("DATABASE_OWNER_URL is set but DATABASE_URL is not; set both or neither")
    DATABASES: dict[str, dict[str, object]] = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(DATA_DIR / "proof.sqlite3"),
            # IMMEDIATE: a transaction takes the write lock at BEGIN (waiting up to `timeout`).
            # A deferred one that reads, then writes, fails at once with "database is locked"
            # when another thread (ingest's writers) committed in between.
            "OPTIONS": {
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL;",
                "transaction_mode": "IMMEDIATE",
            },
            "TEST": {"NAME": env_optional("PROOF_SQLITE_TEST_NAME")},
        }
    }
else:
    # Only `migrate` (and the test suite) need the owner's credentials: web, ingest and workers
    # run with DATABASE_URL alone, so they never hold a role that could alter the schema.
    DATABASES = {"default": _app_db.django()}
    if _owner_db is not None:
        if _owner_db.user == _app_db.user:
            raise EnvError(
                "DATABASE_URL and DATABASE_OWNER_URL use the same role "
                f"({_app_db.user!r}); the application role must not own the tables"
            )
        # In tests the owner alias creates and migrates the test database and the app alias
        # is pointed at it (conftest.py: django_db_setup), as in production.
        DATABASES["owner"] = _owner_db.django()

DATABASE_ROUTERS = ["proof_web.db_router.AppRoleRouter"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
IS_POSTGRES = _app_db is not None

# --- Redis, Celery, Channels -----------------------------------------------------------------
REDIS_URL = env_optional("REDIS_URL")
EMBEDDED = REDIS_URL is None and _app_db is None

# Where an enqueued task goes, chosen here once: with Redis, to its queue for the worker and
# beat processes; in the embedded default and under tests (whose shared Redis has no worker
# for them), to an in-process memory broker that only the in-process runner consumes
# (proof_web/runner.py: the schedule's periodic tasks and a small worker pool, as `proof demo`
# runs it). Never eager: a task enqueued by ingest must not run in ingest's writer thread.
TASKS_IN_PROCESS = REDIS_URL is None or PROOF_ENV == "test"
CELERY_BROKER_URL = "memory://localhost/" if TASKS_IN_PROCESS else REDIS_URL
# The in-process queue is polled: 0.1 s keeps a queued task's wait short, at a few idle
# wake-ups a second.
CELERY_BROKER_TRANSPORT_OPTIONS = {"polling_interval": 0.1} if TASKS_IN_PROCESS else {}
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = False
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TIMEZONE = "UTC"
# Each job's evaluations go to one of this many queues (investigations/routing.py), so the
# worker on it keeps the job's recent data; 1: no routing, every worker takes every task.
PROOF_EVAL_QUEUES = env_int("PROOF_EVAL_QUEUES", 1, minimum=1)
CELERY_TASK_ROUTES = ("investigations.routing.route_task",)
# Samples (16 bytes each) a worker keeps of its jobs' recent data (investigations/
# window_cache.py); the least recently evaluated jobs are dropped first.
PROOF_EVAL_CACHE_SAMPLES = env_int("PROOF_EVAL_CACHE_SAMPLES", 64_000_000, minimum=0)

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "proof",
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- Auth ------------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"
# Sign-in throttling (tenants/login_throttle.py, docs/tenancy.md "Sign-in throttling"): after
# this many failed sign-ins within the window, for one account or from one address, that account
# or address is refused for the lockout period, even with the right password. The address limit
# is higher so that one office behind a NAT is not locked out by a few people's typos.
PROOF_LOGIN_MAX_FAILURES = env_int("PROOF_LOGIN_MAX_FAILURES", 5, minimum=1)
PROOF_LOGIN_MAX_ADDRESS_FAILURES = env_int("PROOF_LOGIN_MAX_ADDRESS_FAILURES", 20, minimum=1)
PROOF_LOGIN_WINDOW_S = env_int("PROOF_LOGIN_WINDOW_S", 900, minimum=1)
PROOF_LOGIN_LOCKOUT_S = env_int("PROOF_LOGIN_LOCKOUT_S", 900, minimum=1)
# The throttle's cache keys start with this (not from the environment: the root conftest gives
# each test its own, so counts never carry between tests or test runs sharing one Redis).
PROOF_LOGIN_CACHE_PREFIX = "login"

# --- The investigation agent (investigator/, docs/investigations.md) --------------------------
# Explain each new verdict revision on a local model (the investigations.explain_verdict task,
# enqueued after the revision's commit). Off under tests: the suites that need it run it.
PROOF_EXPLAIN = env_bool("PROOF_EXPLAIN", PROOF_ENV != "test")
# A GGUF file instead of the default model package's (the explain extra).
PROOF_EXPLAIN_MODEL_PATH = env_optional("PROOF_EXPLAIN_MODEL_PATH")
# A local OpenAI-compatible server (llama-server, vLLM) instead of the in-process model, and the
# model name it serves. Hosts outside loopback/private ranges are refused unless allowed.
PROOF_EXPLAIN_ENDPOINT = env_optional("PROOF_EXPLAIN_ENDPOINT")
PROOF_EXPLAIN_ENDPOINT_MODEL = env_str("PROOF_EXPLAIN_ENDPOINT_MODEL", "default")
PROOF_EXPLAIN_ALLOW_REMOTE = env_bool("PROOF_EXPLAIN_ALLOW_REMOTE", False)
# "Ask about this incident": questions per user (or API token), <count>/<s|min|hour|day>, apart
# from PROOF_API_RATE: each question is a model run (10–30 s of a core with the default model).
PROOF_ASK_RATE = env_str("PROOF_ASK_RATE", "30/hour")

# --- Notifications: chat, paging, webhooks, e-mail (notify/, docs/notifications.md) -----------
# The console's address as people outside reach it: messages link to its verdict pages.
PROOF_PUBLIC_URL = env_str("PROOF_PUBLIC_URL", "http://127.0.0.1:8000")
# Each delivery attempt's connect and read timeout: a hanging receiver costs its own row this.
PROOF_NOTIFY_TIMEOUT_S = env_float("PROOF_NOTIFY_TIMEOUT_S", 5.0, minimum=0.1)
# Let channels post to loopback/private/link-local addresses (a receiver on this host or
# network); off in production so a channel cannot make the server call its own network.
PROOF_NOTIFY_ALLOW_PRIVATE = env_bool("PROOF_NOTIFY_ALLOW_PRIVATE", not IS_PRODUCTION)
PROOF_PAGERDUTY_EVENTS_URL = env_str(
    "PROOF_PAGERDUTY_EVENTS_URL", "https://events.pagerduty.com/v2/enqueue"
)
# E-mail channels go through Django's SMTP backend.
EMAIL_BACKEND = env_str("PROOF_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env_str("PROOF_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("PROOF_EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("PROOF_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = env_str("PROOF_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env_bool("PROOF_EMAIL_TLS", False)
DEFAULT_FROM_EMAIL = env_str("PROOF_EMAIL_FROM", "proof@localhost")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["tenants.api.permissions.HasPrincipal"],
    # Lists page by cursor (`next`, `?page_size=` up to 500): stable while rows arrive and
    # as cheap at the millionth row as at the first (tenants/api/pagination.py).
    "DEFAULT_PAGINATION_CLASS": "tenants.api.pagination.ProofCursorPagination",
    "PAGE_SIZE": 100,
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # DRF's parsers with the API's input limits: body size, JSON depth, objects only, no NUL
    # or lone surrogates (tenants/api/limits.py, docs/api.md "Limits").
    "DEFAULT_PARSER_CLASSES": [
        "tenants.api.parsers.LimitedJSONParser",
        "tenants.api.parsers.LimitedFormParser",
        "tenants.api.parsers.LimitedMultiPartParser",
    ],
    # One JSON error shape for every 4xx (tenants/api/errors.py, docs/api.md).
    "EXCEPTION_HANDLER": "tenants.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "tenants.api.schema.ProofAutoSchema",
    # Per token (each token may carry its own rate), per user for sessions, per address for
    # anonymous requests (the schema); counted in the cache: Redis in production.
    "DEFAULT_THROTTLE_CLASSES": ["tenants.api.throttling.PrincipalRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {
        "principal": env_str("PROOF_API_RATE", "600/min"),
        "anonymous": env_str("PROOF_API_ANON_RATE", "60/min"),
    },
}

# OpenAPI 3.1 of /api/v1/, generated from the code: /api/v1/schema/, Swagger UI at /api/v1/docs/.
SPECTACULAR_SETTINGS = {
    "OAS_VERSION": "3.1.0",
    "TITLE": "Proof API",
    "VERSION": "1.0.0",
    "DESCRIPTION": (
        "Verdicts, incidents, jobs and the fleet of one GPU operator (or one of its customers), "
        "for support engineers and ticket systems. Authenticate with `Authorization: Bearer "
        "<token>`. Errors are one JSON shape, lists page by cursor, GETs carry an ETag. "
        "See docs/api.md."
    ),
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema holds no tenant data: anyone who can reach the server may read it.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": "/api/v1/",
    "SWAGGER_UI_SETTINGS": {"persistAuthorization": True},
    # The schema is generated and checked (--fail-on-warn) by tests/api in CI, not at each
    # `check --deploy` of a production host.
    "ENABLE_DJANGO_DEPLOY_CHECK": False,
    "ENUM_NAME_OVERRIDES": {
        "TokenScopeEnum": "tenants.models.TokenScope",
        "TokenScopeInputEnum": "tenants.api.serializers.TOKEN_SCOPE_INPUT_CHOICES",
        "ChannelKindEnum": "notify.models.ChannelKind",
        "DeliveryKindEnum": "notify.models.DeliveryKind",
        "IncidentStateEnum": "investigations.models.IncidentState",
        "JobStateEnum": "ingest.models.JobState",
        "NodeStateEnum": "investigations.selectors_fleet.NODE_STATES",
        "GpuHealthEnum": "investigations.selectors_fleet.GPU_HEALTH",
    },
}

# --- i18n, static ----------------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if IS_PRODUCTION
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}

# --- Security (production) -------------------------------------------------------------------
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
if IS_PRODUCTION:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("PROOF_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("PROOF_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

# --- Billing: metering, Stripe, dunning, licences (billing/, docs/billing.md) ----------------
# No secret key: billing stays local (usage rows, projected invoices; no Stripe call is made),
# as an air-gapped site needs; the console says so.
BILLING_STRIPE_SECRET_KEY = env_optional("PROOF_STRIPE_SECRET_KEY")
BILLING_STRIPE_WEBHOOK_SECRET = env_optional("PROOF_STRIPE_WEBHOOK_SECRET")
# Stripe's API (a test points it at a local fake; a proxy in front of Stripe, at that proxy).
BILLING_STRIPE_API_BASE = env_str("PROOF_STRIPE_API_BASE", "https://api.stripe.com")
# The Stripe meter the usage goes to: its event name, and its id for the reconciliation reads.
BILLING_STRIPE_METER_EVENT = env_str("PROOF_STRIPE_METER_EVENT", "proof_gpu_month_units")
BILLING_STRIPE_METER_ID = env_optional("PROOF_STRIPE_METER_ID")
# Days a past-due account keeps its verdicts before they are paused (ingest never stops).
BILLING_GRACE_DAYS = env_int("PROOF_BILLING_GRACE_DAYS", 14, minimum=0)
# Air-gapped licence: the signed file, Proof's Ed25519 public key that signs it (base64 of the
# 32 raw bytes), the days verdicts continue past its cap or expiry, and the site's own Ed25519
# private key (PEM) that signs the usage reports `proof billing export` writes.
LICENCE_FILE = env_optional("PROOF_LICENCE_FILE")
LICENCE_PUBLIC_KEY = env_optional("PROOF_LICENCE_PUBLIC_KEY")
LICENCE_GRACE_DAYS = env_int("PROOF_LICENCE_GRACE_DAYS", 14, minimum=0)
BILLING_EXPORT_KEY_FILE = env_optional("PROOF_BILLING_EXPORT_KEY_FILE")

# --- Ingest (gRPC from agents; docs/ingest.md) ------------------------------------------------
INGEST_TLS_CERT = env_optional("PROOF_INGEST_TLS_CERT")  # PEM paths; both or neither
INGEST_TLS_KEY = env_optional("PROOF_INGEST_TLS_KEY")
if (INGEST_TLS_CERT is None) != (INGEST_TLS_KEY is None):
    raise EnvError("set both PROOF_INGEST_TLS_CERT and PROOF_INGEST_TLS_KEY, or neither")
INGEST_MAX_BATCH_BYTES = env_int("PROOF_INGEST_MAX_BATCH_BYTES", 32 * 1024 * 1024, minimum=1024)
INGEST_MAX_AGE_S = env_int("PROOF_INGEST_MAX_AGE_S", 7 * 86400, minimum=60)
INGEST_MAX_FUTURE_S = env_int("PROOF_INGEST_MAX_FUTURE_S", 300, minimum=1)
INGEST_RETENTION_DAYS = env_int("PROOF_INGEST_RETENTION_DAYS", 30, minimum=1)
INGEST_QUEUE_DEPTH = env_int("PROOF_INGEST_QUEUE_DEPTH", 64, minimum=1)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("PROOF_LOG_LEVEL", "INFO")},
    # stripe logs every request and response at INFO: billing logs what matters itself.
    "loggers": {"django.db.backends": {"level": "WARNING"}, "stripe": {"level": "WARNING"}},
}
