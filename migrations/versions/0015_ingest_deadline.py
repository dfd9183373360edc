"""runs.ingest_deadline_at: the ingest deadline of an analyzing run, in a column of its own; it was
kept in lease_expires_at, which is the agent's lease. Runs analyzing now get their deadline copied
over, and their lease cleared (no agent holds an analyzing run).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02 15:10:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMN on every dialect: a batch copy of runs on SQLite would cascade to its
    # artifacts and results through their foreign keys (0010).
    op.add_column('runs', sa.Column('ingest_deadline_at', sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE runs SET ingest_deadline_at = lease_expires_at, lease_expires_at = NULL "
               "WHERE status = 'analyzing'")


def downgrade() -> None:
    op.execute("UPDATE runs SET lease_expires_at = ingest_deadline_at WHERE status = 'analyzing'")
    if op.get_bind().dialect.name == 'sqlite':  # in place, as 0010 does: a batch copy would cascade
        op.execute('ALTER TABLE runs DROP COLUMN ingest_deadline_at')
    else:
        op.drop_column('runs', 'ingest_deadline_at')
