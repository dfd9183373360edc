"""suite_points.memory: each point's memory figures (the program's planned bytes and weights, the
runtime's allocation and the peak RSS, medians over the point's runs), so a suite's series shows
memory beside latency and flags a change of the deterministic figures exactly. NULL for points
recorded before it.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 22:00:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('suite_points') as batch:
        batch.add_column(sa.Column('memory', sa.JSON(), nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name == 'sqlite':
        # In place, as 0010 does: a batch copy of the table would cascade through the foreign keys.
        op.execute('ALTER TABLE suite_points DROP COLUMN memory')
        return
    op.drop_column('suite_points', 'memory')
