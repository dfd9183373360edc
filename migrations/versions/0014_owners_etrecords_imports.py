"""Owners and teams, ETRecords and imported experiments.

- teams, users: a token belongs to a user (api_tokens.user_id); users may share a team. An
  experiment's and a suite's owner is a user (owner_id). Rows stored before this belong to the
  user "admin", made here.
- experiments.etrecord_sha256: the ETRecord submitted with the model (content-addressed in the
  store like a model), which attributes operators to the user's modules and lines. NULL: none.
- experiments.imported: for an experiment imported from a kit run directory (measured outside the
  farm), what the kit's manifest said of it; NULL for the farm's own.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 20:45:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

ADMIN = "admin"


def upgrade() -> None:
    op.create_table(
        'teams',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('name', sa.String(length=64), nullable=False, unique=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        'users',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('name', sa.String(length=64), nullable=False, unique=True),
        sa.Column('team_id', sa.Integer(), sa.ForeignKey('teams.id', ondelete='SET NULL'), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    )
    # Plain ADD COLUMN on every dialect: a batch copy of these tables on SQLite would cascade through
    # the foreign keys that point at them (0010). The owner columns refer to users on PostgreSQL.
    op.add_column('api_tokens', sa.Column('user_id', sa.Integer(), nullable=True))
    op.add_column('experiments', sa.Column('owner_id', sa.Integer(), nullable=True))
    op.add_column('suites', sa.Column('owner_id', sa.Integer(), nullable=True))
    op.add_column('experiments', sa.Column('etrecord_sha256', sa.String(length=64), nullable=True))
    op.add_column('experiments', sa.Column('imported', sa.JSON(), nullable=True))
    if op.get_bind().dialect.name != 'sqlite':
        for table in ('api_tokens', 'experiments', 'suites'):
            col = 'user_id' if table == 'api_tokens' else 'owner_id'
            op.create_foreign_key(f'fk_{table}_{col}', table, 'users', [col], ['id'], ondelete='SET NULL')
    op.create_index('ix_experiments_owner_id', 'experiments', ['owner_id'])
    # Everything stored before owners existed belongs to the admin user.
    bind = op.get_bind()
    bind.execute(sa.text("INSERT INTO users (name, created_at) VALUES (:n, CURRENT_TIMESTAMP)"), {"n": ADMIN})
    admin_id = bind.execute(sa.text("SELECT id FROM users WHERE name = :n"), {"n": ADMIN}).scalar_one()
    for table, col in (('api_tokens', 'user_id'), ('experiments', 'owner_id'), ('suites', 'owner_id')):
        bind.execute(sa.text(f"UPDATE {table} SET {col} = :a WHERE {col} IS NULL"), {"a": admin_id})


def downgrade() -> None:
    op.drop_index('ix_experiments_owner_id', 'experiments')
    sqlite = op.get_bind().dialect.name == 'sqlite'
    for table, col in (('api_tokens', 'user_id'), ('experiments', 'owner_id'), ('suites', 'owner_id'),
                       ('experiments', 'etrecord_sha256'), ('experiments', 'imported')):
        if sqlite:  # in place, as 0010 does: a batch copy would cascade through the foreign keys
            op.execute(f'ALTER TABLE {table} DROP COLUMN {col}')
        else:
            if col in ('user_id', 'owner_id'):
                op.drop_constraint(f'fk_{table}_{col}', table, type_='foreignkey')
            op.drop_column(table, col)
    op.drop_table('users')
    op.drop_table('teams')
