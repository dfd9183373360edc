"""suites: scheduled suites of stored models, their runs, series points (raw samples kept) and
the changes the nightly detector flagged, with their webhook delivery state

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-22 11:00:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table('suites',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('models', sa.JSON(), nullable=False),
    sa.Column('device', sa.JSON(), nullable=False),
    sa.Column('sme2', sa.String(length=4), nullable=False),
    sa.Column('threads', sa.JSON(), nullable=False),
    sa.Column('iterations', sa.Integer(), nullable=False),
    sa.Column('warmup', sa.Integer(), nullable=False),
    sa.Column('sessions', sa.Integer(), nullable=False),
    sa.Column('schedule', sa.String(length=120), nullable=False),
    sa.Column('min_effect', sa.Float(), nullable=False),
    sa.Column('alpha', sa.Float(), nullable=False),
    sa.Column('canary', sa.Boolean(), nullable=False),
    sa.Column('webhook', sa.String(length=2000), nullable=True),
    sa.Column('next_run_at', TS, nullable=True),
    sa.Column('last_run_at', TS, nullable=True),
    sa.Column('created_at', TS, nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name'),
    )
    op.create_index('ix_suites_next_run_at', 'suites', ['next_run_at'])
    op.create_table('suite_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('suite_id', sa.Integer(), nullable=False),
    sa.Column('trigger', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('triggered_at', TS, nullable=False),
    sa.Column('finished_at', TS, nullable=True),
    sa.ForeignKeyConstraint(['suite_id'], ['suites.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_suite_runs_suite_id', 'suite_runs', ['suite_id'])
    op.create_table('suite_experiments',
    sa.Column('experiment_id', sa.Integer(), nullable=False),
    sa.Column('suite_run_id', sa.Integer(), nullable=False),
    sa.Column('model_sha256', sa.String(length=64), nullable=False),
    sa.Column('model_name', sa.String(length=200), nullable=False),
    sa.ForeignKeyConstraint(['experiment_id'], ['experiments.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['suite_run_id'], ['suite_runs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('experiment_id'),
    )
    op.create_index('ix_suite_experiments_suite_run_id', 'suite_experiments', ['suite_run_id'])
    op.create_table('suite_points',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('suite_id', sa.Integer(), nullable=False),
    sa.Column('suite_run_id', sa.Integer(), nullable=False),
    sa.Column('experiment_id', sa.Integer(), nullable=True),
    sa.Column('model_sha256', sa.String(length=64), nullable=False),
    sa.Column('model_name', sa.String(length=200), nullable=False),
    sa.Column('device_model', sa.String(length=256), nullable=False),
    sa.Column('device_id', sa.Integer(), nullable=True),
    sa.Column('sme2', sa.String(length=3), nullable=False),
    sa.Column('threads', sa.Integer(), nullable=False),
    sa.Column('run_ids', sa.JSON(), nullable=False),
    sa.Column('at', TS, nullable=False),
    sa.Column('samples', sa.JSON(), nullable=False),
    sa.Column('median_ms', sa.Float(), nullable=True),
    sa.Column('low_ms', sa.Float(), nullable=True),
    sa.Column('high_ms', sa.Float(), nullable=True),
    sa.Column('n_iterations', sa.Integer(), nullable=False),
    sa.Column('sessions', sa.Integer(), nullable=False),
    sa.Column('runner', sa.String(length=256), nullable=True),
    sa.Column('et_version', sa.String(length=128), nullable=True),
    sa.Column('device_state', sa.JSON(), nullable=False),
    sa.Column('acknowledged', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['suite_id'], ['suites.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['suite_run_id'], ['suite_runs.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['experiment_id'], ['experiments.id'], ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('suite_run_id', 'model_sha256', 'device_model', 'sme2', 'threads'),
    )
    op.create_index('ix_suite_points_series', 'suite_points', ['suite_id', 'model_sha256', 'device_model', 'sme2', 'threads'])
    op.create_table('suite_changes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('suite_id', sa.Integer(), nullable=False),
    sa.Column('point_id', sa.Integer(), nullable=False),
    sa.Column('model_sha256', sa.String(length=64), nullable=False),
    sa.Column('model_name', sa.String(length=200), nullable=False),
    sa.Column('device_model', sa.String(length=256), nullable=False),
    sa.Column('sme2', sa.String(length=3), nullable=False),
    sa.Column('threads', sa.Integer(), nullable=False),
    sa.Column('direction', sa.String(length=12), nullable=False),
    sa.Column('ratio', sa.Float(), nullable=False),
    sa.Column('ci_low', sa.Float(), nullable=True),
    sa.Column('ci_high', sa.Float(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('blamed', sa.String(length=8), nullable=False),
    sa.Column('experiment_id', sa.Integer(), nullable=True),
    sa.Column('baseline_experiment_id', sa.Integer(), nullable=True),
    sa.Column('detail', sa.JSON(), nullable=False),
    sa.Column('sentence', sa.Text(), nullable=False),
    sa.Column('detected_at', TS, nullable=False),
    sa.Column('confirmed_at', TS, nullable=True),
    sa.Column('acknowledged_at', TS, nullable=True),
    sa.Column('webhook_state', sa.String(length=12), nullable=False),
    sa.Column('webhook_attempts', sa.Integer(), nullable=False),
    sa.Column('webhook_last_error', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['suite_id'], ['suites.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['point_id'], ['suite_points.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['experiment_id'], ['experiments.id'], ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['baseline_experiment_id'], ['experiments.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('point_id'),
    )
    op.create_index('ix_suite_changes_suite_id', 'suite_changes', ['suite_id'])


def downgrade() -> None:
    op.drop_table('suite_changes')
    op.drop_table('suite_points')
    op.drop_table('suite_experiments')
    op.drop_table('suite_runs')
    op.drop_table('suites')
