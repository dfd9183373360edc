"""suites: names unique ignoring case, held by a unique index on lower(name) (the service's
409 alone let two creates racing with "Nightly" and "nightly" both in).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 15:45:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('uq_suites_name_lower', 'suites', [sa.text('lower(name)')], unique=True)


def downgrade() -> None:
    op.drop_index('uq_suites_name_lower', table_name='suites')
