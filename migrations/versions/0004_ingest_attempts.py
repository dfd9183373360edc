"""runs.ingest_attempts: how many times ingest was sent for a run (the analyzing reaper's bound)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 14:00:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('ingest_attempts', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('ingest_attempts')
