"""experiment inputs: the SME2IN01 container the runs are fed, and what the report says about it

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 08:10:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing experiments ran with the runner's default inputs: the server default says so.
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('inputs_sha256', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('inputs_size', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('inputs_description', sa.String(length=400),
                                      server_default='all ones (default)', nullable=False))
        batch_op.create_index(batch_op.f('ix_experiments_inputs_sha256'), ['inputs_sha256'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('experiments', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_experiments_inputs_sha256'))
        batch_op.drop_column('inputs_description')
        batch_op.drop_column('inputs_size')
        batch_op.drop_column('inputs_sha256')
