"""Alembic environment: the URL comes from the caller (server.db.migrate) or SME2_DATABASE_URL."""

from alembic import context

from sme2farm.server.config import get_settings
from sme2farm.server.store.db import get_engine
from sme2farm.server.store.models import Base

config = context.config
url = config.attributes.get("sqlalchemy_url") or get_settings().sqlalchemy_url

with get_engine(url).connect() as connection:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
