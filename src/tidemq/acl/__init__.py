"""RocketMQ 4.x plain ACL for the broker and the name server's write operations.

It sits below both servers (beside ``remoting``; the import contract says so), because both
enforce it; it knows requests (``protocol``) and nothing of either server.

- ``acl_file``: ``plain_acl.yml`` read into accounts, and written back atomically;
- ``address``: white-address patterns; ``permission``: PUB/SUB/DENY and admin-only codes;
- ``resources``: which topics and groups a request touches;
- ``validator``: the check of one request, in RocketMQ's order;
- ``service``: hot reload, the remoting request guard, changes by request;
- ``admin_requests``: the ACL administration request codes.
"""

from tidemq.acl.acl_file import Account, AclFileError, AclRules, load_acl_file
from tidemq.acl.service import AclService
from tidemq.acl.validator import AclValidator

__all__ = ["Account", "AclFileError", "AclRules", "AclService", "AclValidator", "load_acl_file"]
