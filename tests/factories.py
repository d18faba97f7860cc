"""factory-boy factories shared by the suite."""

from __future__ import annotations

import factory

from accounts.models import Role, User

PASSWORD = "correct-Horse-battery-9"


class UserFactory(factory.django.DjangoModelFactory):
    """A USER with a known password; trait ``admin`` makes an ADMIN (staff)."""

    class Meta:
        model = User
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda o: f"{o.username}@example.test")
    role = Role.USER
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    class Params:
        admin = factory.Trait(role=Role.ADMIN, is_staff=True, is_superuser=True)

    @factory.post_generation
    def _save(obj: User, create: bool, extracted: object, **kwargs: object) -> None:  # noqa: N805
        if create:
            obj.save()
