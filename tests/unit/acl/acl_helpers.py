"""Helpers of the ACL unit tests (imported by module name; pytest puts this folder on sys.path)."""

from __future__ import annotations

from pathlib import Path

from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.signature import Signer, sign_ext_fields

ACL_YAML = """\
globalWhiteRemoteAddresses:
  - 10.9.9.*
accounts:
  - accessKey: publisher
    secretKey: pub-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Orders=PUB
      - Audit=SUB
  - accessKey: consumer
    secretKey: sub-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: SUB
    topicPerms: [Secret=DENY]
    groupPerms: [billing=SUB, blocked=DENY]
  - accessKey: operator
    secretKey: admin-secret
    admin: true
  - accessKey: trusted-host
    secretKey: whatever-1
    whiteRemoteAddress: 10.1.1.{1,2}
"""


def write_acl(directory: Path, text: str = ACL_YAML) -> Path:
    path = directory / "plain_acl.yml"
    path.write_text(text)
    return path


def signed(command: RemotingCommand, access_key: str, secret_key: str) -> RemotingCommand:
    """``command`` signed as a RocketMQ client with these credentials signs it."""
    fields = dict(command.ext_fields or {})
    sign_ext_fields(fields, command.body, access_key, Signer(secret_key))
    command.ext_fields = fields
    return command
