"""Django settings: one place, read from the environment, failing loudly on bad values.

Local development needs no variables at all (DEBUG defaults to true and the services
default to this machine's PostgreSQL and Redis). ``DEBUG=false`` is production: then
SECRET_KEY and ALLOWED_HOSTS are required and every deploy check passes.
"""

from __future__ import annotations

import base64
import hashlib
import sys
from pathlib import Path

import environ
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from counselor_engine.counselor import CounselorConfig
from counselor_engine.lipo.config import LipoConfig
from webapp.lib.env import (
    env_bool,
    env_choice,
    env_fernet_keys,
    env_float,
    env_int,
    env_list,
    env_str,
    env_url,
    require,
)

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("PSYEVO_DATA_DIR", str(BASE_DIR / "var")) or BASE_DIR / "var")

DEBUG = env_bool("DEBUG", True)
TESTING = "pytest" in sys.modules or env_bool("PSYEVO_TESTING", False)

if DEBUG:
    SECRET_KEY = env_str("SECRET_KEY") or "dev-only-insecure-key-do-not-use-in-production"
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
else:
    SECRET_KEY = require("SECRET_KEY")
    require("ALLOWED_HOSTS")
    ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# Transcript and memory text are encrypted at rest (webapp/lib/crypto.py) with these Fernet keys;
# the first encrypts, all decrypt, `manage.py rotate_keys` moves every row to the first.
PSYEVO_ENCRYPTION_KEYS = env_fernet_keys("PSYEVO_ENCRYPTION_KEYS")
PSYEVO_ENCRYPTION_KEY_IS_DERIVED = False
if not PSYEVO_ENCRYPTION_KEYS:
    if not DEBUG:
        require("PSYEVO_ENCRYPTION_KEYS")
    # Development only: a key derived from SECRET_KEY, so local data stays readable between
    # runs. Changing SECRET_KEY makes that data unreadable; production must set real keys.
    # The servers say so on start-up (webapp.lib.crypto.warn_if_development_key).
    PSYEVO_ENCRYPTION_KEY_IS_DERIVED = True
    PSYEVO_ENCRYPTION_KEYS = [
        base64.urlsafe_b64encode(
            hashlib.sha256(b"psyevo-dev-encryption-key:" + SECRET_KEY.encode()).digest()
        ).decode()
    ]

INSTALLED_APPS = [
    "daphne",  # first: its runserver serves ASGI (websockets) in development
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "axes",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "webapp.accounts",
    "webapp.counseling",
    "webapp.memory",
    "webapp.learning",
    "webapp.oversight",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django_otp.middleware.OTPMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "webapp.accounts.middleware.StaffIdleTimeoutMiddleware",
    "webapp.accounts.mfa.MfaRequiredMiddleware",
    "webapp.oversight.security.AdminGateMiddleware",  # non-admins: 403 + log at /admin/
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes requires
]

ROOT_URLCONF = "webapp.urls"
ASGI_APPLICATION = "webapp.asgi.application"
WSGI_APPLICATION = "webapp.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "csp.context_processors.nonce",
            ],
        },
    },
]

# --- Services -------------------------------------------------------------------------
DATABASE_URL = env_url(
    "DATABASE_URL",
    "postgres://postgres@127.0.0.1:5432/psyevo",
    schemes=("postgres", "postgresql", "pgsql"),
)
DATABASES = {"default": environ.Env.db_url_config(DATABASE_URL)}
DATABASES["default"]["CONN_MAX_AGE"] = env_int("DB_CONN_MAX_AGE", 0, minimum=0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"].setdefault("OPTIONS", {})["connect_timeout"] = env_int(
    "DB_CONNECT_TIMEOUT", 5, minimum=1
)

REDIS_URL = env_url("REDIS_URL", "redis://127.0.0.1:6379/0", schemes=("redis", "rediss", "unix"))

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # redis-py reads with a 5 s timeout by default, the same as the layer's blocking
            # receive: idle sockets then died with 1011 after ~5 s. Read longer than that.
            "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
            "prefix": env_str("CHANNELS_PREFIX", "psyevo"),
        },
    }
}

CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "psyevo",
        "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2},
    }
}

# --- Celery (namespace CELERY_, read by webapp/celery.py) ------------------------------
CELERY_BROKER_URL = env_url(
    "CELERY_BROKER_URL", REDIS_URL, schemes=("redis", "rediss", "unix", "amqp", "amqps")
)
CELERY_RESULT_BACKEND = None  # the database row is the source of truth, never the backend
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ROUTES = {"training_worker.tasks.*": {"queue": "training"}}
CELERY_BROKER_CONNECTION_TIMEOUT = 3
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 6 * 3600}
CELERY_TASK_ALWAYS_EAGER = False
# Periodic upkeep (the `beat` process): retry crisis emails that could not be sent when the
# flag was raised, escalate unacknowledged crisis flags whose countdown task was lost, and
# return evidence leased by a training worker that died.
CELERY_BEAT_SCHEDULE = {
    "deliver-alerts": {"task": "webapp.oversight.tasks.deliver_alerts", "schedule": 60.0},
    "escalate-overdue-flags": {
        "task": "webapp.oversight.tasks.escalate_overdue_flags",
        "schedule": 60.0,
    },
    "release-expired-leases": {
        "task": "webapp.learning.tasks.release_expired_leases",
        "schedule": 300.0,
    },
}
# The trainer's foreground entry point, by name like the task above: `manage.py lipo_round
# --now` runs a round in its own process through it, and no webapp module imports
# training_worker. Called as runner(run_id, progress=callback(phase, done, total)) -> outcome.
PSYEVO_FOREGROUND_ROUND = "training_worker.round.run_round"

# --- Auth -------------------------------------------------------------------------------
AUTH_USER_MODEL = "accounts.User"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first, so a locked-out login never authenticates
    "django.contrib.auth.backends.ModelBackend",
]
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    "django.contrib.auth.hashers.ScryptPasswordHasher",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 12},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = env_float("AXES_COOLOFF_HOURS", 0.25, minimum=0.0)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_RESET_ON_SUCCESS = True
AXES_IPWARE_PROXY_COUNT = env_int("PROXY_COUNT", 0, minimum=0) or None

SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 12 * 3600, minimum=60)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
# Clinicians and admins see other people's data: log them out after this idle time.
STAFF_IDLE_TIMEOUT_SECONDS = env_int("STAFF_IDLE_TIMEOUT_SECONDS", 30 * 60, minimum=60)
CSRF_COOKIE_HTTPONLY = True  # pages send the token from a template (hx-headers), not from JS
CSRF_COOKIE_SAMESITE = "Lax"
# Clinicians and admins need a TOTP device (webapp/accounts/mfa.py). On by default in
# production; off by default in development and under pytest, where tests that need it turn
# it on (webapp/accounts/tests/mfa.py shows how a test logs in with a verified device).
PSYEVO_REQUIRE_MFA = env_bool("PSYEVO_REQUIRE_MFA", not DEBUG and not TESTING)
OTP_TOTP_ISSUER = env_str("OTP_TOTP_ISSUER", "PsyEvo Counselor")
OTP_ADMIN_HIDE_SENSITIVE_DATA = True  # admins reset a device; they never see its secret

# --- Security ---------------------------------------------------------------------------
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
if not DEBUG:
    # TLS ends at the reverse proxy, which must set X-Forwarded-Proto.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # probes from the proxy's network speak plain HTTP

CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],  # CSP3: 'self' covers ws(s):// on the same host
        "font-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

# --- Static files -------------------------------------------------------------------------
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
WHITENOISE_USE_FINDERS = DEBUG or TESTING
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if not DEBUG and not TESTING
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}

# --- Email (crisis alerts go out through it) -----------------------------------------------
EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.console.EmailBackend"
    if DEBUG
    else "django.core.mail.backends.smtp.EmailBackend",
)
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
# Seconds before an SMTP connection or send gives up: a hung mail server must not hold the
# crisis alert delivery task (the alert is retried with backoff instead).
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "psyevo@localhost")

# --- Internationalisation ------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Product settings ----------------------------------------------------------------------
# The engine's defaults are written once, in CounselorConfig; settings name only what an
# operator may change (webapp/counseling/runtime.py maps these back onto the engine).
_ENGINE = CounselorConfig()
PSYEVO_BACKEND = env_choice("PSYEVO_BACKEND", "transformers", ("transformers", "vllm"))
PSYEVO_MODEL_PATH = env_str("PSYEVO_MODEL_PATH", "")
PSYEVO_VLLM_URL = env_str("PSYEVO_VLLM_URL", "")
PSYEVO_VLLM_MODEL = env_str("PSYEVO_VLLM_MODEL", "smollm2-135m-instruct")
PSYEVO_SAFETY_LOCALE = env_str("PSYEVO_SAFETY_LOCALE", _ENGINE.safety_locale)
PSYEVO_MODE = env_choice("PSYEVO_MODE", _ENGINE.mode, ("graph", "stream_first"))
PSYEVO_CANDIDATES = env_int("PSYEVO_CANDIDATES", _ENGINE.n_candidates, minimum=1)
# Eq. 12: "binary" criterion votes (the paper's z) or "soft" probabilities; see judge.py.
PSYEVO_JUDGE_VOTES = env_choice("PSYEVO_JUDGE_VOTES", _ENGINE.judge_votes, ("binary", "soft"))
# How each criterion's vote is obtained: "auto" picks the evaluator measured best for the
# judge's model (counselor_engine.judge.DEFAULT_EVALUATOR_BY_MODEL; bench/RESULTS.md).
PSYEVO_JUDGE_EVALUATOR = env_choice(
    "PSYEVO_JUDGE_EVALUATOR", "auto", ("auto", "ab", "ab_debiased", "contrastive")
)
# The internal evaluator may run on another model or server than the counselor (the
# paper's did): "counselor" shares the counselor's backend (base model, never an adapter).
PSYEVO_JUDGE_BACKEND = env_choice(
    "PSYEVO_JUDGE_BACKEND", "counselor", ("counselor", "transformers", "vllm")
)
# The console warns that the learning loop has stalled after this many judged turns in a
# row added no preference edge (webapp/learning/health.py).
PSYEVO_LOOP_STALL_TURNS = env_int("PSYEVO_LOOP_STALL_TURNS", 20, minimum=1)
PSYEVO_JUDGE_MODEL_PATH = env_str("PSYEVO_JUDGE_MODEL_PATH", "")
PSYEVO_JUDGE_VLLM_URL = env_str("PSYEVO_JUDGE_VLLM_URL", "")
PSYEVO_JUDGE_VLLM_MODEL = env_str("PSYEVO_JUDGE_VLLM_MODEL", "")
PSYEVO_MAX_NEW_TOKENS = env_int(
    "PSYEVO_MAX_NEW_TOKENS", _ENGINE.generation.max_new_tokens, minimum=1
)
PSYEVO_TEMPERATURE = env_float("PSYEVO_TEMPERATURE", _ENGINE.generation.temperature, minimum=0.0)
PSYEVO_TURN_BUDGET = env_int("PSYEVO_TURN_BUDGET", _ENGINE.turn_budget, minimum=1)
PSYEVO_PLANNED_SESSIONS = env_int("PSYEVO_PLANNED_SESSIONS", 8, minimum=1)
PSYEVO_MAX_MESSAGE_CHARS = env_int("PSYEVO_MAX_MESSAGE_CHARS", _ENGINE.max_message_chars, minimum=1)
# Longer than the engine's 120 s on purpose: a graph-mode turn on 2 CPU cores (SmolLM2, the
# contrastive judge) takes about 135 s (bench/RESULTS.md, bench_turn).
PSYEVO_BACKEND_TIMEOUT = env_float("PSYEVO_BACKEND_TIMEOUT", 300.0, minimum=1.0)
PSYEVO_TORCH_THREADS = env_int("PSYEVO_TORCH_THREADS", 0, minimum=0)  # 0: torch's default
# The in-process (transformers) model runs in a child process of each server so that its
# work never holds the event loop; the child lowers its priority by PSYEVO_MODEL_NICE so
# frames and crisis replies come first on busy cores (counselor_engine/backends/process_backend).
PSYEVO_MODEL_PROCESS = env_bool("PSYEVO_MODEL_PROCESS", True)
PSYEVO_MODEL_NICE = env_int("PSYEVO_MODEL_NICE", 10, minimum=0)
# Websocket limits (the consumer enforces them; daphne also caps frames at 64 KiB).
WS_MAX_FRAME_BYTES = env_int("WS_MAX_FRAME_BYTES", 65536, minimum=1024)
WS_RATE_LIMIT = env_int("WS_RATE_LIMIT", 20, minimum=1)  # messages ...
WS_RATE_WINDOW_SECONDS = env_float("WS_RATE_WINDOW_SECONDS", 10.0, minimum=0.1)  # ... per window
WS_REAUTH_SECONDS = env_float("WS_REAUTH_SECONDS", 30.0, minimum=0.1)
# Benchmarks only: stamp token frames with their send time (bench/bench_ws.py).
WS_TIMESTAMP_FRAMES = env_bool("WS_TIMESTAMP_FRAMES", False)
PSYEVO_ESCALATION_SECONDS = env_int("PSYEVO_ESCALATION_SECONDS", 300, minimum=0)
HEALTHZ_TIMEOUT_SECONDS = env_float("HEALTHZ_TIMEOUT_SECONDS", 1.5, minimum=0.1)
ADAPTER_DIR = Path(
    env_str("PSYEVO_ADAPTER_DIR", str(DATA_DIR / "adapters")) or DATA_DIR / "adapters"
)
# Crisis messages held while PostgreSQL is down, until written (webapp/counseling/spool.py).
CRISIS_SPOOL_DIR = DATA_DIR / "crisis-spool"

# --- LiPO training rounds (read by webapp.learning and training_worker) -------------------
# Every default and bound lives in LipoConfig (counselor_engine/lipo/config.py); this reads
# the environment once and fails at startup on a bad value.
_LIPO = LipoConfig()
try:
    LIPO = LipoConfig(
        sessions_per_round=env_int("LIPO_SESSIONS_PER_ROUND", _LIPO.sessions_per_round),
        batch_edges=env_int("LIPO_BATCH_EDGES", _LIPO.batch_edges),
        min_groups=env_int("LIPO_MIN_GROUPS", _LIPO.min_groups),
        modalities=tuple(env_list("LIPO_MODALITIES", list(_LIPO.modalities))),
        min_share=env_float("LIPO_MIN_SHARE", _LIPO.min_share),
        lora_rank=env_int("LIPO_LORA_RANK", _LIPO.lora_rank),
        learning_rate=env_float("LIPO_LEARNING_RATE", _LIPO.learning_rate),
        steps=env_int("LIPO_STEPS", _LIPO.steps),
        beta=env_float("LIPO_BETA", _LIPO.beta),
        max_length=env_int("LIPO_MAX_LENGTH", _LIPO.max_length),
        lease_minutes=env_int("LIPO_LEASE_MINUTES", _LIPO.lease_minutes),
        max_attempts=env_int("LIPO_MAX_ATTEMPTS", _LIPO.max_attempts),
        max_update_ratio=env_float("LIPO_MAX_UPDATE_RATIO", _LIPO.max_update_ratio),
        side_by_side=env_int("LIPO_SIDE_BY_SIDE", _LIPO.side_by_side),
        side_by_side_tokens=env_int("LIPO_SIDE_BY_SIDE_TOKENS", _LIPO.side_by_side_tokens),
        arena_clients=env_int("LIPO_ARENA_CLIENTS", _LIPO.arena_clients),  # 0: no arena check
    )
except ValueError as exc:  # the field is LIPO_<FIELD> in the environment
    raise ImproperlyConfigured(f"LIPO_*: {exc}") from None

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    # Known secret values (SECRET_KEY, encryption keys, service passwords) never reach a log.
    "filters": {"redact_secrets": {"()": "webapp.lib.logsafety.RedactSecretsFilter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["redact_secrets"],
        }
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.security": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "psyevo.security": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "axes": {"handlers": ["console"], "level": "WARNING", "propagate": False},
    },
}
