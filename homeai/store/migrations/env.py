"""Alembic environment for the household store.

`homeai.store.db.migrate` hands over an open connection in `config.attributes`; the
alembic command line instead names a database with `sqlalchemy.url`. Offline mode
(`--sql`) prints the SQL for any dialect, PostgreSQL included, without connecting.
"""

from alembic import context

from homeai.store.db import make_engine
from homeai.store.models import Base

config = context.config


def run_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"),
                      target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url"))
    try:
        with engine.begin() as connection:
            _run_on(connection)
    finally:
        engine.dispose()


def _run_on(connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
