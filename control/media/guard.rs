//! The SSRF guard: which network addresses an image URL may lead to.
//!
//! A client-supplied image URL makes the gateway open a connection from
//! inside the operator's network. Without a guard, `http://169.254.169.254/`
//! reads cloud credentials and `http://10.0.0.5:8080/admin` reaches internal
//! services. So only public unicast addresses are allowed, unless the
//! operator allow-lists a network or a host name.
//!
//! Checking the URL's host name is not enough: a name can resolve to a
//! private address, or resolve to a public one when checked and a private one
//! when connected (DNS rebinding). The guard therefore sits in the HTTP
//! client's resolver ([`VettingResolver`]): the addresses it vets are the
//! only ones the client ever connects to, with no second lookup. IP-literal
//! hosts never reach a resolver, so the fetcher checks those itself with
//! [`DestinationPolicy::check`] before every request, redirects included.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::error::excerpt;

/// What kind of address an IP is, as far as the guard cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    /// Globally routable unicast: the only class allowed by default.
    Public,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// RFC 1918 (`10/8`, `172.16/12`, `192.168/16`), IPv6 unique local
    /// (`fc00::/7`) and deprecated site-local (`fec0::/10`).
    Private,
    /// Carrier-grade NAT shared space, `100.64.0.0/10`.
    SharedAddressSpace,
    /// `169.254.0.0/16` (home of cloud metadata endpoints), `fe80::/10`.
    LinkLocal,
    /// `0.0.0.0`, `::` (connecting to them reaches the local host).
    Unspecified,
    /// `255.255.255.255`.
    Broadcast,
    /// `224.0.0.0/4`, `ff00::/8`.
    Multicast,
    /// Not routable on the internet: "this network" `0/8`, IETF protocol
    /// assignments, benchmarking, documentation, `240/4`, discard-only,
    /// Teredo and local-use NAT64 prefixes.
    Reserved,
}

impl AddressClass {
    fn describe(self) -> &'static str {
        match self {
            AddressClass::Public => "public",
            AddressClass::Loopback => "a loopback address",
            AddressClass::Private => "a private address",
            AddressClass::SharedAddressSpace => "a carrier-grade NAT (shared) address",
            AddressClass::LinkLocal => "a link-local address (cloud metadata lives there)",
            AddressClass::Unspecified => "the unspecified address",
            AddressClass::Broadcast => "the broadcast address",
            AddressClass::Multicast => "a multicast address",
            AddressClass::Reserved => "a reserved, non-routable address",
        }
    }
}

/// IPv4 ranges that are not public, most specific first.
const IPV4_RANGES: &[([u8; 4], u8, AddressClass)] = &[
    ([0, 0, 0, 0], 32, AddressClass::Unspecified),
    ([255, 255, 255, 255], 32, AddressClass::Broadcast),
    ([0, 0, 0, 0], 8, AddressClass::Reserved),
    ([10, 0, 0, 0], 8, AddressClass::Private),
    ([100, 64, 0, 0], 10, AddressClass::SharedAddressSpace),
    ([127, 0, 0, 0], 8, AddressClass::Loopback),
    ([169, 254, 0, 0], 16, AddressClass::LinkLocal),
    ([172, 16, 0, 0], 12, AddressClass::Private),
    ([192, 0, 0, 0], 24, AddressClass::Reserved),
    ([192, 0, 2, 0], 24, AddressClass::Reserved),
    ([192, 168, 0, 0], 16, AddressClass::Private),
    ([198, 18, 0, 0], 15, AddressClass::Reserved),
    ([198, 51, 100, 0], 24, AddressClass::Reserved),
    ([203, 0, 113, 0], 24, AddressClass::Reserved),
    ([224, 0, 0, 0], 4, AddressClass::Multicast),
    ([240, 0, 0, 0], 4, AddressClass::Reserved),
];

/// IPv6 ranges that are not public (embedded-IPv4 forms are handled before
/// this table), most specific first.
const IPV6_RANGES: &[(u128, u8, AddressClass)] = &[
    (0, 128, AddressClass::Unspecified),
    (1, 128, AddressClass::Loopback),
    (0x0064_ff9b_0001 << 80, 48, AddressClass::Reserved),
    (0x0100 << 112, 64, AddressClass::Reserved),
    (0x2001_0000 << 96, 32, AddressClass::Reserved),
    (0x2001_0db8 << 96, 32, AddressClass::Reserved),
    (0xfc00 << 112, 7, AddressClass::Private),
    (0xfe80 << 112, 10, AddressClass::LinkLocal),
    (0xfec0 << 112, 10, AddressClass::Private),
    (0xff00 << 112, 8, AddressClass::Multicast),
];

/// Classifies an address. IPv6 forms that carry an IPv4 address a packet
/// may end up at (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`,
/// NAT64 `64:ff9b::a.b.c.d`, 6to4 `2002:AABB:CCDD::`) take the class of that
/// IPv4 address, so `::ffff:169.254.169.254` is as link-local as the real
/// thing.
pub(crate) fn classify(ip: IpAddr) -> AddressClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => match embedded_ipv4(v6) {
            Some(v4) => classify_v4(v4),
            None => classify_v6(v6),
        },
    }
}

fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    let bits = u32::from(ip);
    IPV4_RANGES
        .iter()
        .find(|(network, prefix, _)| within(bits, u32::from_be_bytes(*network), *prefix))
        .map_or(AddressClass::Public, |(_, _, class)| *class)
}

fn classify_v6(ip: Ipv6Addr) -> AddressClass {
    let bits = u128::from(ip);
    IPV6_RANGES
        .iter()
        .find(|(network, prefix, _)| within128(bits, *network, *prefix))
        .map_or(AddressClass::Public, |(_, _, class)| *class)
}

fn within(address: u32, network: u32, prefix: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    address & mask == network & mask
}

fn within128(address: u128, network: u128, prefix: u8) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
    address & mask == network & mask
}

/// The IPv4 address an IPv6 address delivers to, for the transition forms
/// that embed one.
fn embedded_ipv4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(ip);
    let low32 = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    if let Some(mapped) = ip.to_ipv4_mapped() {
        return Some(mapped);
    }
    // IPv4-compatible (deprecated): ::a.b.c.d, but not :: and ::1 themselves.
    if bits >> 32 == 0 && bits > 1 {
        return Some(low32);
    }
    // NAT64 well-known prefix 64:ff9b::/96.
    if bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000 {
        return Some(low32);
    }
    // 6to4: 2002:AABB:CCDD::/48 carries AA.BB.CC.DD.
    if bits >> 112 == 0x2002 {
        return Some(Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32));
    }
    None
}

/// An operator's exception to the guard (`allow_private_hosts`).
///
/// Parsed from text: a CIDR network (`10.0.0.0/8`, `fd00::/8`), a single
/// address (`127.0.0.1`), an exact host name (`images.internal`) or a
/// subdomain wildcard (`*.corp.example`, which matches `a.corp.example` but
/// not `corp.example` itself). A host allowance lets that name resolve to
/// any address; a network allowance lets any name (or IP literal) reach
/// addresses inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrivateHostAllowance {
    Network(IpNet),
    Host(String),
    Subdomains(String),
}

impl PrivateHostAllowance {
    fn allows_host(&self, host: &str) -> bool {
        match self {
            PrivateHostAllowance::Network(_) => false,
            PrivateHostAllowance::Host(name) => host == name,
            PrivateHostAllowance::Subdomains(suffix) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|label| label.len() > 1 && label.ends_with('.')),
        }
    }

    fn allows_address(&self, ip: IpAddr) -> bool {
        match self {
            PrivateHostAllowance::Network(network) => network.contains(&ip),
            PrivateHostAllowance::Host(_) | PrivateHostAllowance::Subdomains(_) => false,
        }
    }
}

impl FromStr for PrivateHostAllowance {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if let Ok(network) = text.parse::<IpNet>() {
            return Ok(Self::Network(network));
        }
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Ok(Self::Network(IpNet::from(ip)));
        }
        let (wildcard, name) = match text.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let name = normalize_host(name);
        let valid_name = !name.is_empty()
            && name
                .split('.')
                .all(|label| !label.is_empty() && label.bytes().all(is_host_byte));
        if !valid_name {
            return Err(format!(
                "{text:?} is neither a network (10.0.0.0/8), an address, a host name nor a *.domain wildcard"
            ));
        }
        Ok(if wildcard {
            Self::Subdomains(name)
        } else {
            Self::Host(name)
        })
    }
}

fn is_host_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_'
}

/// Host names compare case-insensitively and without a trailing root dot.
fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// A destination the guard refused, with the reason. It travels through the
/// HTTP client's error chain as the resolver's error, where the fetcher
/// finds it again to answer `media_url_forbidden`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForbiddenDestination {
    /// The host name as written in the URL (or the IP literal).
    pub host: String,
    pub address: IpAddr,
    pub class: AddressClass,
}

/// What a client reads: the host as it wrote it, and for an address it
/// wrote, that address's class. What a name resolved to is the operator's
/// DNS, not the client's business (an SSRF probe would map the internal
/// network with it): [`ForbiddenDestination::detail`] is for the log.
impl fmt::Display for ForbiddenDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host == self.address.to_string() {
            write!(f, "{} is {}", self.address, self.class.describe())?;
        } else {
            write!(
                f,
                "{} resolves to a non-public address",
                excerpt(&self.host)
            )?;
        }
        f.write_str(
            "; the gateway only fetches from public addresses unless allow_private_hosts lists it",
        )
    }
}

impl std::error::Error for ForbiddenDestination {}

impl ForbiddenDestination {
    /// The refusal with the address the host resolved to, for the log.
    pub fn detail(&self) -> String {
        format!(
            "{} resolved to {}, which is {}",
            self.host,
            self.address,
            self.class.describe()
        )
    }
}

/// The guard's rule: public addresses pass, everything else only when an
/// allowance covers the host name or the address.
#[derive(Debug, Clone, Default)]
pub struct DestinationPolicy {
    allowances: Vec<PrivateHostAllowance>,
}

impl DestinationPolicy {
    pub fn new(allowances: Vec<PrivateHostAllowance>) -> Self {
        Self { allowances }
    }

    /// Whether connecting to `address` on behalf of a URL naming `host` is
    /// allowed. `host` is the URL's host: a name, or the IP literal itself.
    pub fn check(&self, host: &str, address: IpAddr) -> Result<(), ForbiddenDestination> {
        let host = normalize_host(host);
        if self.allowances.iter().any(|allow| allow.allows_host(&host)) {
            return Ok(());
        }
        let class = classify(address);
        if class == AddressClass::Public {
            return Ok(());
        }
        let unmapped = address.to_canonical();
        let allowed = self
            .allowances
            .iter()
            .any(|allow| allow.allows_address(address) || allow.allows_address(unmapped));
        if allowed {
            return Ok(());
        }
        Err(ForbiddenDestination {
            host,
            address,
            class,
        })
    }
}

/// The address a URL host names literally (`10.0.0.1`, `[::1]`), or `None`
/// for a host name. Such hosts never reach a resolver, so a client vets
/// them itself with [`DestinationPolicy::check`] before every request.
///
/// The URL parser normalizes every IPv4 spelling (`2852039166`,
/// `0xA9FEA9FE`) to dotted form and brackets IPv6, so a host that parses as
/// an address here is exactly what the HTTP client would dial.
/// What a failed request through a [`VettingResolver`] client comes to, as
/// a client may read it.
#[derive(Debug)]
pub(crate) enum SendFailure<'a> {
    /// The guard refused the destination (the resolver's error, found in
    /// the client's error chain).
    Forbidden(&'a ForbiddenDestination),
    TimedOut,
    /// A short description (`could not connect`, `the request failed`);
    /// the error chain itself (OS errors, what a name resolved to) is for
    /// the log only.
    Failed(&'static str),
}

impl<'a> SendFailure<'a> {
    pub(crate) fn of(error: &'a reqwest::Error) -> Self {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(current) = source {
            if let Some(refusal) = current.downcast_ref::<ForbiddenDestination>() {
                return SendFailure::Forbidden(refusal);
            }
            source = current.source();
        }
        if error.is_timeout() {
            SendFailure::TimedOut
        } else if error.is_connect() {
            SendFailure::Failed("could not connect")
        } else {
            SendFailure::Failed("the request failed")
        }
    }
}

pub(crate) fn literal_address(host: &str) -> Option<IpAddr> {
    host.strip_prefix('[')
        .and_then(|inner| inner.strip_suffix(']'))
        .unwrap_or(host)
        .parse()
        .ok()
}

/// The HTTP client's resolver: looks the name up once and hands the client
/// only the addresses the policy allows, so the connection goes exactly to
/// a vetted address.
#[derive(Debug, Clone)]
pub(crate) struct VettingResolver {
    policy: Arc<DestinationPolicy>,
}

impl VettingResolver {
    pub(crate) fn new(policy: Arc<DestinationPolicy>) -> Self {
        Self { policy }
    }
}

impl Resolve for VettingResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = Arc::clone(&self.policy);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut first_refusal = None;
            let mut vetted = Vec::with_capacity(resolved.len());
            for address in resolved {
                match policy.check(&host, address.ip()) {
                    Ok(()) => vetted.push(address),
                    Err(refusal) => {
                        first_refusal.get_or_insert(refusal);
                    }
                }
            }
            match (vetted.is_empty(), first_refusal) {
                (true, Some(refusal)) => {
                    tracing::warn!(refusal = %refusal.detail(), "the SSRF guard refused a host");
                    Err(refusal.into())
                }
                (true, None) => Err(format!("{host} resolved to no address").into()),
                (false, _) => Ok(Box::new(vetted.into_iter()) as Addrs),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("test addresses are valid")
    }

    #[test]
    fn ipv4_classes() {
        let cases = [
            ("8.8.8.8", AddressClass::Public),
            ("1.1.1.1", AddressClass::Public),
            ("0.0.0.0", AddressClass::Unspecified),
            ("0.1.2.3", AddressClass::Reserved),
            ("10.0.0.1", AddressClass::Private),
            ("10.255.255.255", AddressClass::Private),
            ("100.63.255.255", AddressClass::Public),
            ("100.64.0.1", AddressClass::SharedAddressSpace),
            ("100.127.255.255", AddressClass::SharedAddressSpace),
            ("100.128.0.0", AddressClass::Public),
            ("127.0.0.1", AddressClass::Loopback),
            ("127.255.0.9", AddressClass::Loopback),
            ("169.254.169.254", AddressClass::LinkLocal),
            ("169.255.0.1", AddressClass::Public),
            ("172.15.255.255", AddressClass::Public),
            ("172.16.0.1", AddressClass::Private),
            ("172.31.255.255", AddressClass::Private),
            ("172.32.0.0", AddressClass::Public),
            ("192.0.0.170", AddressClass::Reserved),
            ("192.0.2.1", AddressClass::Reserved),
            ("192.168.1.1", AddressClass::Private),
            ("192.169.0.1", AddressClass::Public),
            ("198.18.0.1", AddressClass::Reserved),
            ("198.19.255.255", AddressClass::Reserved),
            ("198.51.100.7", AddressClass::Reserved),
            ("203.0.113.9", AddressClass::Reserved),
            ("224.0.0.1", AddressClass::Multicast),
            ("239.255.255.250", AddressClass::Multicast),
            ("240.0.0.1", AddressClass::Reserved),
            ("255.255.255.255", AddressClass::Broadcast),
        ];
        for (address, expected) in cases {
            assert_eq!(classify(ip(address)), expected, "{address}");
        }
    }

    #[test]
    fn ipv6_classes() {
        let cases = [
            ("2606:4700:4700::1111", AddressClass::Public),
            ("2a00:1450:4001::200e", AddressClass::Public),
            ("::", AddressClass::Unspecified),
            ("::1", AddressClass::Loopback),
            ("fc00::1", AddressClass::Private),
            ("fd12:3456:789a::1", AddressClass::Private),
            ("fe80::1", AddressClass::LinkLocal),
            ("febf:ffff::1", AddressClass::LinkLocal),
            ("fec0::1", AddressClass::Private),
            ("ff02::1", AddressClass::Multicast),
            ("100::1", AddressClass::Reserved),
            ("2001:db8::1", AddressClass::Reserved),
            ("2001:0:4136:e378::1", AddressClass::Reserved),
            ("64:ff9b:1::a00:1", AddressClass::Reserved),
        ];
        for (address, expected) in cases {
            assert_eq!(classify(ip(address)), expected, "{address}");
        }
    }

    #[test]
    fn ipv6_forms_embedding_ipv4_take_the_ipv4_class() {
        let cases = [
            ("::ffff:127.0.0.1", AddressClass::Loopback),
            ("::ffff:169.254.169.254", AddressClass::LinkLocal),
            ("::ffff:a9fe:a9fe", AddressClass::LinkLocal),
            ("::ffff:10.0.0.1", AddressClass::Private),
            ("::ffff:100.64.0.1", AddressClass::SharedAddressSpace),
            ("::ffff:0.0.0.0", AddressClass::Unspecified),
            ("::ffff:255.255.255.255", AddressClass::Broadcast),
            ("::ffff:224.0.0.1", AddressClass::Multicast),
            ("::ffff:8.8.8.8", AddressClass::Public),
            ("::127.0.0.1", AddressClass::Loopback),
            ("::8.8.8.8", AddressClass::Public),
            ("64:ff9b::169.254.169.254", AddressClass::LinkLocal),
            ("64:ff9b::8.8.8.8", AddressClass::Public),
            ("2002:a9fe:a9fe::1", AddressClass::LinkLocal),
            ("2002:c0a8:0101::", AddressClass::Private),
            ("2002:0808:0808::1", AddressClass::Public),
        ];
        for (address, expected) in cases {
            assert_eq!(classify(ip(address)), expected, "{address}");
        }
    }

    #[test]
    fn allowances_parse_from_text() {
        let cases = [
            (
                "10.0.0.0/8",
                PrivateHostAllowance::Network("10.0.0.0/8".parse().expect("cidr")),
            ),
            (
                "127.0.0.1",
                PrivateHostAllowance::Network("127.0.0.1/32".parse().expect("cidr")),
            ),
            (
                "::1",
                PrivateHostAllowance::Network("::1/128".parse().expect("cidr")),
            ),
            (
                "Images.Internal.",
                PrivateHostAllowance::Host("images.internal".to_owned()),
            ),
            (
                "*.corp.example",
                PrivateHostAllowance::Subdomains("corp.example".to_owned()),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(text.parse::<PrivateHostAllowance>(), Ok(expected), "{text}");
        }
        for bad in ["", "*.", "a..b", "http://x", "10.0.0.0/33", "a b"] {
            assert!(bad.parse::<PrivateHostAllowance>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn policy_applies_allowances() {
        let allow = |texts: &[&str]| {
            DestinationPolicy::new(
                texts
                    .iter()
                    .map(|text| text.parse().expect("test allowances parse"))
                    .collect(),
            )
        };
        let none = allow(&[]);
        let loopback = allow(&["127.0.0.1"]);
        let subnet = allow(&["10.1.0.0/16"]);
        let hosts = allow(&["images.internal", "*.corp.example"]);
        // (policy, host, address, allowed)
        let cases = [
            (&none, "example.com", "93.184.215.14", true),
            (&none, "127.0.0.1", "127.0.0.1", false),
            (&none, "metadata.google.internal", "169.254.169.254", false),
            (&loopback, "127.0.0.1", "127.0.0.1", true),
            (&loopback, "localhost", "127.0.0.1", true),
            (&loopback, "::ffff:127.0.0.1", "::ffff:127.0.0.1", true),
            (&loopback, "127.0.0.2", "127.0.0.2", false),
            (&loopback, "::1", "::1", false),
            (&subnet, "a", "10.1.200.3", true),
            (&subnet, "a", "10.2.0.1", false),
            (&hosts, "images.internal", "10.9.9.9", true),
            (&hosts, "IMAGES.internal.", "10.9.9.9", true),
            (&hosts, "other.internal", "10.9.9.9", false),
            (&hosts, "a.corp.example", "192.168.0.7", true),
            (&hosts, "deep.a.corp.example", "192.168.0.7", true),
            (&hosts, "corp.example", "192.168.0.7", false),
            (&hosts, "evilcorp.example", "192.168.0.7", false),
        ];
        for (policy, host, address, allowed) in cases {
            assert_eq!(
                policy.check(host, ip(address)).is_ok(),
                allowed,
                "{host} -> {address} under {policy:?}"
            );
        }
    }

    #[test]
    fn refusal_names_the_host_to_the_client_and_the_address_to_the_log() {
        let refusal = DestinationPolicy::default()
            .check("metadata.internal", ip("169.254.169.254"))
            .expect_err("link-local is refused");
        assert_eq!(refusal.class, AddressClass::LinkLocal);
        let text = refusal.to_string();
        assert!(
            text.contains("metadata.internal resolves to a non-public address"),
            "{text}"
        );
        assert!(!text.contains("169.254"), "{text}");
        assert!(!text.contains("link-local"), "{text}");
        let detail = refusal.detail();
        assert!(
            detail.contains("metadata.internal resolved to 169.254.169.254")
                && detail.contains("link-local"),
            "{detail}"
        );
        // An address the client wrote is its own: named, with its class.
        let literal = DestinationPolicy::default()
            .check("10.0.0.5", ip("10.0.0.5"))
            .expect_err("private is refused")
            .to_string();
        assert!(literal.starts_with("10.0.0.5 is "), "{literal}");
    }

    #[tokio::test]
    async fn resolver_refuses_names_that_resolve_to_loopback() {
        let resolver = VettingResolver::new(Arc::new(DestinationPolicy::default()));
        let name: Name = "localhost".parse().expect("valid name");
        let error = match resolver.resolve(name).await {
            Ok(addresses) => panic!("resolved to {:?}", addresses.collect::<Vec<_>>()),
            Err(error) => error,
        };
        let refusal = error
            .downcast_ref::<ForbiddenDestination>()
            .expect("the resolver's error is the guard's refusal");
        assert_eq!(refusal.class, AddressClass::Loopback);
    }

    #[tokio::test]
    async fn resolver_keeps_only_vetted_addresses() {
        let policy = DestinationPolicy::new(vec!["127.0.0.1".parse().expect("allowance")]);
        let resolver = VettingResolver::new(Arc::new(policy));
        let name: Name = "localhost".parse().expect("valid name");
        let addresses: Vec<SocketAddr> = resolver
            .resolve(name)
            .await
            .expect("localhost has 127.0.0.1")
            .collect();
        // localhost may also resolve to ::1, which is not allowed here.
        assert!(!addresses.is_empty());
        assert!(
            addresses
                .iter()
                .all(|address| address.ip() == ip("127.0.0.1")),
            "{addresses:?}"
        );
    }
}
