"""`proof setup-db`: create the two PostgreSQL roles and the database Proof needs.

- the owner role (DATABASE_OWNER_URL's user) owns the schema and runs migrations; it may
  create databases so the test suite can make its own;
- the app role (DATABASE_URL's user) is what web, ingest and workers connect as:
  NOSUPERUSER NOBYPASSRLS, owns nothing, so row-level security binds every query; it may not
  choose its tenant either (tenants/rls.py: a grant needs a proof signed with a key it cannot
  read), and its statements' parameters (where those proofs travel) are never logged.

Connects with PROOF_ADMIN_DATABASE_URL (a superuser; default the local postgres superuser).
Idempotent: safe to run on every deploy and in CI.
"""

from __future__ import annotations

import argparse

from proof_web.env import env_str, parse_database_url


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--admin-url",
        default=None,
        help="superuser URL (default: $PROOF_ADMIN_DATABASE_URL or postgres://postgres@127.0.0.1/postgres)",
    )


def run(args: argparse.Namespace) -> int:
    import psycopg
    from psycopg import sql

    admin_url = args.admin_url or env_str(
        "PROOF_ADMIN_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"
    )
    app = parse_database_url("DATABASE_URL", env_str("DATABASE_URL"))
    owner = parse_database_url("DATABASE_OWNER_URL", env_str("DATABASE_OWNER_URL"))
    if app.name != owner.name:
        raise SystemExit("DATABASE_URL and DATABASE_OWNER_URL must name the same database")
    if app.user == owner.user:
        raise SystemExit("DATABASE_URL and DATABASE_OWNER_URL must use different roles")

    with psycopg.connect(admin_url, autocommit=True) as conn:
        for role, password, attrs in (
            (owner.user, owner.password, "LOGIN CREATEDB NOSUPERUSER NOBYPASSRLS"),
            (app.user, app.password, "LOGIN NOCREATEDB NOSUPERUSER NOBYPASSRLS"),
        ):
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone()
            verb = "ALTER" if exists else "CREATE"
            statement = sql.SQL(f"{verb} ROLE {{}} WITH {attrs}").format(sql.Identifier(role))
            if password:
                statement = sql.SQL("{} PASSWORD {}").format(statement, sql.Literal(password))
            conn.execute(statement)
            print(f"role {role}: {'updated' if exists else 'created'}")
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [app.name]).fetchone()
        if not exists:
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(app.name), sql.Identifier(owner.user)
                )
            )
            print(f"database {app.name}: created")
        else:
            print(f"database {app.name}: exists")
    # Schema-level: the owner owns public so its migrations can create there; the app may only
    # use it. Table grants follow each migrate (tenants/rls.py).
    with psycopg.connect(admin_url.rsplit("/", 1)[0] + f"/{app.name}", autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER SCHEMA public OWNER TO {}").format(sql.Identifier(owner.user)))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(app.user)))
        conn.execute(sql.SQL("REVOKE CREATE ON SCHEMA public FROM PUBLIC"))
        # The tenant proofs (tenants/context.py) travel as bound parameters so no other
        # session's pg_stat_activity shows them; keep them out of the server log too, should
        # statement logging be on. Superuser-only settings: the app role cannot undo them.
        for setting in ("log_parameter_max_length", "log_parameter_max_length_on_error"):
            conn.execute(
                sql.SQL("ALTER ROLE {} SET {} = 0").format(
                    sql.Identifier(app.user), sql.Identifier(setting)
                )
            )
        print(f"role {app.user}: statement parameters never logged")
    return 0
