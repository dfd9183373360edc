"""models.memory: what a stored program asks of memory before anything runs, read from the .pte
at submission (analysis.pte.program_memory: each method's planned arenas, the constant, delegate,
named and mutable data it carries). NULL for programs stored before it: reports say "not recorded".

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 21:45:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('models') as batch:
        batch.add_column(sa.Column('memory', sa.JSON(), nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name == 'sqlite':
        # In place, as 0010 does: a batch copy of `models` would cascade through the foreign keys.
        op.execute('ALTER TABLE models DROP COLUMN memory')
        return
    op.drop_column('models', 'memory')
