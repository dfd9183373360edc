"""run_results: the parts of a run's analysis that GET /experiments/{id} shows, stored apart as
JSON text (report_head: e2e_ms and load_ms; operators_json; kernels_json), so a report is read
without the database parsing every run's whole analysis (its per-iteration samples are most of
it). Rows stored before this revision have them NULL and are read from the whole analysis.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-22 11:30:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('run_results') as batch:
        batch.add_column(sa.Column('report_head', sa.Text(), nullable=True))
        batch.add_column(sa.Column('operators_json', sa.Text(), nullable=True))
        batch.add_column(sa.Column('kernels_json', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('run_results') as batch:
        batch.drop_column('kernels_json')
        batch.drop_column('operators_json')
        batch.drop_column('report_head')
