"""`manage.py create_operator`: a new operator (tenant) and its first operator admin.

Without --admin-password a strong password is generated and printed once; --prompt asks for
one instead. Bad input (duplicate slug or username, invalid slug, weak password) fails with a
message naming what was wrong and creates nothing.
"""

from __future__ import annotations

import getpass
import secrets
from typing import Any

from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants import services


class Command(BaseCommand):
    help = "Create an operator (a paying tenant) and its first operator admin."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", required=True, help="display name, e.g. 'Acme GPU Cloud'")
        parser.add_argument("--slug", required=True, help="short unique id, e.g. acme")
        parser.add_argument("--admin-username", required=True)
        parser.add_argument("--admin-email", default="")
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--admin-password", help="default: generate one and print it")
        group.add_argument(
            "--prompt", action="store_true", help="ask for the admin password on the terminal"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        password = options["admin_password"]
        generated = False
        if options["prompt"]:
            password = getpass.getpass("Admin password: ")
            if password != getpass.getpass("Admin password (again): "):
                raise CommandError("the two passwords differ")
        elif not password:
            password = secrets.token_urlsafe(18)
            generated = True
        try:
            validate_password(password)
        except ValidationError as exc:
            raise CommandError(f"admin password refused: {' '.join(exc.messages)}") from None
        try:
            operator, user = services.do_create_operator(
                name=options["name"],
                slug=options["slug"],
                admin_username=options["admin_username"],
                admin_email=options["admin_email"],
                admin_password=password,
            )
        except services.TenancyError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"Created operator {operator.name!r} (slug {operator.slug}, id {operator.pk}) "
            f"with operator admin {user.get_username()!r}."
        )
        if generated:
            self.stdout.write(f"Generated admin password (shown once): {password}")
