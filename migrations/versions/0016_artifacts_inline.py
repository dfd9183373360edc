"""artifacts: the attempt that delivered each one, and a small artifact's bytes (runner.log,
memory.json and kernels.log up to 256 KiB) kept in its row, so a delivery writes the store the
trace and the outputs only, and ingest reads those two. Rows stored before have both NULL: their
artifacts are in the store, as before.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02 19:20:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('artifacts', sa.Column('attempt', sa.Integer(), nullable=True))
    op.add_column('artifacts', sa.Column('data', sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    # An artifact kept in its row has no object in the store: it goes with the column.
    op.execute('DELETE FROM artifacts WHERE data IS NOT NULL')
    with op.batch_alter_table('artifacts') as batch:  # artifacts has no children: a batch copy cascades nothing
        batch.drop_column('data')
        batch.drop_column('attempt')
