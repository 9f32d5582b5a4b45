//! Who may change the nodes: the ACL every node is created with, and the check of the base
//! node's ACL when a session opens (see the crate documentation, "Authentication").

use base64::Engine as _;
use zk::Permission;
use zookeeper_client as zk;

use crate::config::Digest;

/// With digest credentials: the session's own identity (`auth`, which the server replaces by
/// every identity the session authenticated) may do everything, anyone may read (list, get,
/// watch: `distlock status`, monitoring).
static OWNER_ALL_WORLD_READ: [zk::Acl; 2] = [
    zk::Acl::new_const(Permission::ALL, "auth", ""),
    zk::Acl::new_const(Permission::READ, "world", "anyone"),
];

/// The ACL of every node this crate creates: restricted to the session's identity when it
/// authenticates, open (`world:anyone` ALL) otherwise.
pub(crate) fn node_acls(restricted: bool) -> zk::Acls<'static> {
    if restricted {
        zk::Acls::new(&OWNER_ALL_WORLD_READ)
    } else {
        zk::Acls::anyone_all()
    }
}

/// The id ZooKeeper's digest provider gives `user:password`: `user:base64(sha1(user:password))`.
pub(crate) fn digest_id(digest: &Digest) -> String {
    let hash = sha1_smol::Sha1::from(digest.auth_bytes()).digest().bytes();
    format!(
        "{}:{}",
        digest.user,
        base64::engine::general_purpose::STANDARD.encode(hash)
    )
}

/// The ACL id (scheme, id) the server gives this session's credentials: `digest:user:<hash>`,
/// or `sasl:user` with SASL DIGEST-MD5 (the authenticated user name).
pub(crate) fn own_id(digest: &Digest) -> (&'static str, String) {
    if digest.sasl {
        ("sasl", digest.user.clone())
    } else {
        ("digest", digest_id(digest))
    }
}

/// How errors name the credentials' identity: `digest user "x"` or `SASL user "x"`.
pub(crate) fn who(digest: &Digest) -> String {
    let kind = if digest.sasl { "SASL" } else { "digest" };
    format!("{kind} user {:?}", digest.user)
}

/// What the base node's ACL means for this session.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// The session may create lock nodes, and only identities it trusts may change the base.
    Granted,
    /// The session may create lock nodes, but so may anyone: the base was created without
    /// credentials (`world:anyone` may create, delete or change). Worth a warning.
    Open,
    /// Neither this session's identity nor anyone may create nodes in the base: the reason.
    Denied(String),
}

/// Judges the base node's ACL. ACL entries of schemes this crate cannot evaluate (`ip`,
/// `x509`, ...) that grant CREATE give the benefit of the doubt (`Granted`): the server
/// decides on the first write. `digest` and `sasl` entries are decidable: a session has only
/// the identities its credentials give it.
pub(crate) fn judge(acls: &[zk::Acl], digest: Option<&Digest>) -> Access {
    let creates = |acl: &zk::Acl| acl.permission().has(Permission::CREATE);
    let is_world = |acl: &zk::Acl| acl.scheme() == "world" && acl.id() == "anyone";
    let world_changes = acls.iter().any(|acl| {
        is_world(acl)
            && [
                Permission::CREATE,
                Permission::DELETE,
                Permission::WRITE,
                Permission::ADMIN,
            ]
            .into_iter()
            .any(|p| acl.permission().has(p))
    });
    let world_creates = acls.iter().any(|acl| is_world(acl) && creates(acl));
    let undecidable = acls
        .iter()
        .any(|acl| !matches!(acl.scheme(), "world" | "digest" | "sasl") && creates(acl));
    let owners = || {
        let mut owners: Vec<String> = acls
            .iter()
            .filter(|acl| creates(acl))
            .map(|acl| match acl.scheme() {
                // Never the hash: it is derived from that identity's password.
                "digest" => format!(
                    "digest user {:?}",
                    acl.id().split(':').next().unwrap_or_default()
                ),
                "sasl" => format!("SASL user {:?}", acl.id()),
                scheme => format!("{scheme}:{}", acl.id()),
            })
            .collect();
        owners.dedup();
        if owners.is_empty() {
            "nobody may create nodes in it".to_owned()
        } else {
            format!("it belongs to {}", owners.join(", "))
        }
    };
    let Some(digest) = digest else {
        return if world_creates || undecidable {
            Access::Granted
        } else {
            Access::Denied(format!(
                "this client has no credentials and {}: give them in the URL, zk://user:password@host",
                owners()
            ))
        };
    };
    let (own_scheme, own) = own_id(digest);
    let mine = acls
        .iter()
        .any(|acl| acl.scheme() == own_scheme && acl.id() == own && creates(acl));
    if mine || world_creates {
        return if world_changes {
            Access::Open
        } else {
            Access::Granted
        };
    }
    if undecidable {
        return Access::Granted;
    }
    // (A wrong SASL password fails the handshake: the server never answers it with an ACL.)
    let same_user = !digest.sasl
        && acls.iter().any(|acl| {
            acl.scheme() == "digest"
                && acl
                    .id()
                    .split_once(':')
                    .is_some_and(|(user, _)| user == digest.user)
        });
    if same_user {
        Access::Denied(format!(
            "wrong password for digest user {:?} ({} with another password)",
            digest.user,
            owners()
        ))
    } else {
        Access::Denied(format!(
            "the credentials of {} lack permission ({})",
            who(digest),
            owners()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ZkConfig;

    fn digest(user: &str, password: &str) -> Digest {
        ZkConfig::new("h")
            .unwrap()
            .with_digest_auth(user, password)
            .unwrap()
            .digest()
            .unwrap()
            .clone()
    }

    fn acl(perm: Permission, scheme: &str, id: &str) -> zk::Acl {
        zk::Acl::new(perm, zk::AuthId::new(scheme, id))
    }

    #[test]
    fn digest_id_matches_zookeeper() {
        // DigestAuthenticationProvider.generateDigest("super:test") from the ZooKeeper docs.
        assert_eq!(
            digest_id(&digest("super", "test")),
            "super:D/InIHSb7yEEbrWz8b9l71RjZJU="
        );
    }

    #[test]
    fn judges_base_acls() {
        let me = digest("app", "pw");
        let mine = acl(Permission::ALL, "digest", &digest_id(&me));
        let read = acl(Permission::READ, "world", "anyone");
        let open = acl(Permission::ALL, "world", "anyone");
        assert_eq!(
            judge(&[mine.clone(), read.clone()], Some(&me)),
            Access::Granted
        );
        assert_eq!(judge(std::slice::from_ref(&open), Some(&me)), Access::Open);
        assert_eq!(judge(&[open], None), Access::Granted);
        assert_eq!(
            judge(&[acl(Permission::ALL, "ip", "10.0.0.1")], Some(&me)),
            Access::Granted
        );
        let wrong = digest("app", "other");
        let Access::Denied(why) = judge(&[mine.clone(), read.clone()], Some(&wrong)) else {
            panic!("a wrong password was granted");
        };
        assert!(
            why.contains("wrong password for digest user \"app\""),
            "{why}"
        );
        assert!(!why.contains(&digest_id(&me)[4..]), "{why}");
        let Access::Denied(why) = judge(&[mine.clone(), read.clone()], Some(&digest("x", "pw")))
        else {
            panic!("another identity was granted");
        };
        assert!(why.contains("digest user \"x\" lack permission"), "{why}");
        assert!(why.contains("belongs to digest user \"app\""), "{why}");
        // SASL: the id is the user name; digest entries of the same name are another identity.
        let sasl = ZkConfig::new("h")
            .unwrap()
            .with_sasl_auth("app", "pw")
            .unwrap()
            .digest()
            .unwrap()
            .clone();
        let sasl_mine = acl(Permission::ALL, "sasl", "app");
        assert_eq!(
            judge(&[sasl_mine.clone(), read.clone()], Some(&sasl)),
            Access::Granted
        );
        let Access::Denied(why) = judge(&[mine.clone(), read.clone()], Some(&sasl)) else {
            panic!("a digest-owned base was granted to a SASL identity");
        };
        assert!(why.contains("SASL user \"app\" lack permission"), "{why}");
        let Access::Denied(why) = judge(&[sasl_mine, read.clone()], Some(&me)) else {
            panic!("a SASL-owned base was granted to a digest identity");
        };
        assert!(why.contains("belongs to SASL user \"app\""), "{why}");
        let Access::Denied(why) = judge(&[mine, read], None) else {
            panic!("no credentials were granted");
        };
        assert!(why.contains("no credentials"), "{why}");
    }
}
