"""Compare anything: experiments.vs_model_sha256 (`submit A.pte --vs B.pte`), runs.variant (A or B),
devices.noise_model (the device's learned between-session noise, services/noise.py)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 10:40:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('experiments') as batch:
        batch.add_column(sa.Column('vs_model_sha256', sa.String(64), nullable=True))
        batch.create_foreign_key('fk_experiments_vs_model', 'models', ['vs_model_sha256'], ['sha256'])
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('variant', sa.String(1), nullable=False, server_default='A'))
    with op.batch_alter_table('devices') as batch:
        batch.add_column(sa.Column('noise_model', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('devices') as batch:
        batch.drop_column('noise_model')
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('variant')
    with op.batch_alter_table('experiments') as batch:
        batch.drop_constraint('fk_experiments_vs_model', type_='foreignkey')
        batch.drop_column('vs_model_sha256')
