"""Fixtures for the store tests: a real SQLite file per test, migrated to head."""

import pytest

from homeai.store.db import make_engine, make_sessionmaker, migrate


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "data" / "homeai.db"


@pytest.fixture
def db_url(db_path):
    return f"sqlite:///{db_path}"


@pytest.fixture
def engine(db_url):
    migrate(db_url)
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def new_session(engine):
    return make_sessionmaker(engine)


@pytest.fixture
def session(new_session):
    with new_session() as session:
        yield session
