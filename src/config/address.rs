//! Which addresses the gateway connects to on someone else's behalf: global unicast only
//! ([`is_global`]), IPv4 carried in IPv6 judged as the IPv4 address it carries. Used for client
//! metadata documents fetched for a stranger and for remote plugins defined through the admin
//! API.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Whether a connection made for something defined through the admin API may go to `ip`:
/// a global address, or one in the networks the operator allows (`[sandbox]
/// remote_networks`).
pub fn reachable(ip: IpAddr, allowed: &[ipnet::IpNet]) -> bool {
    is_global(ip) || allowed.iter().any(|n| n.contains(&ip))
}

/// Whether a fetch on a stranger's behalf may connect to `ip`: global unicast only, IPv4
/// carried in IPv6 judged as the IPv4 address it carries.
pub fn is_global(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_global_v4(v4),
        IpAddr::V6(v6) => match carried_ipv4(v6) {
            Carried::V4(v4) => is_global_v4(v4),
            Carried::Refused => false,
            Carried::None => is_global_v6(v6),
        },
    }
}

/// What an IPv6 address says about IPv4.
enum Carried {
    /// It stands for this IPv4 address (mapped, or the well-known NAT64 prefix).
    V4(Ipv4Addr),
    /// It carries IPv4 in a form not fetched from at all: IPv4-compatible (deprecated),
    /// IPv4-translated, local-use NAT64, 6to4 and Teredo (transition relays, which no
    /// document server needs).
    Refused,
    None,
}

fn carried_ipv4(v6: Ipv6Addr) -> Carried {
    let s = v6.segments();
    let low = Ipv4Addr::from(v6.to_bits() as u32);
    match s {
        // ::ffff:a.b.c.d
        [0, 0, 0, 0, 0, 0xffff, _, _] => Carried::V4(low),
        // 64:ff9b::a.b.c.d (RFC 6052)
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Carried::V4(low),
        // ::a.b.c.d (and :: and ::1), ::ffff:0:a.b.c.d (RFC 6145)
        [0, 0, 0, 0, 0, 0, _, _] | [0, 0, 0, 0, 0xffff, 0, _, _] => Carried::Refused,
        // 64:ff9b:1::/48 (RFC 8215), 2002::/16 (6to4), 2001::/32 (Teredo)
        [0x64, 0xff9b, 1, ..] | [0x2002, ..] | [0x2001, 0, ..] => Carried::Refused,
        _ => Carried::None,
    }
}

fn is_global_v4(v4: Ipv4Addr) -> bool {
    let [a, b, c, _] = v4.octets();
    !(a == 0                                        // "this network" 0/8
        || a == 10                                  // private 10/8
        || (a == 100 && (b & 0xc0) == 64)           // shared address space 100.64/10
        || a == 127                                 // loopback 127/8
        || (a == 169 && b == 254)                   // link-local 169.254/16
        || (a == 172 && (b & 0xf0) == 16)           // private 172.16/12
        || (a == 192 && b == 0 && c == 0)           // IETF protocol assignments 192.0.0/24
        || (a == 192 && b == 0 && c == 2)           // documentation 192.0.2/24
        || (a == 192 && b == 88 && c == 99)         // 6to4 relay anycast 192.88.99/24
        || (a == 192 && b == 168)                   // private 192.168/16
        || (a == 198 && (b & 0xfe) == 18)           // benchmarking 198.18/15
        || (a == 198 && b == 51 && c == 100)        // documentation 198.51.100/24
        || (a == 203 && b == 0 && c == 113)         // documentation 203.0.113/24
        || a >= 224) // multicast 224/4, reserved 240/4, broadcast
}

fn is_global_v6(v6: Ipv6Addr) -> bool {
    let s = v6.segments();
    // Global unicast is 2000::/3; everything else (loopback, unspecified, unique local
    // fc00::/7, link-local fe80::/10, site-local fec0::/10, multicast, discard 100::/64,
    // SRv6 5f00::/16, ...) is not.
    (s[0] & 0xe000) == 0x2000
        && !(s[0] == 0x2001 && s[1] < 0x0200)       // IETF protocol assignments 2001::/23
        && !(s[0] == 0x2001 && s[1] == 0x0db8)      // documentation 2001:db8::/32
        && !(s[0] == 0x3fff && s[1] < 0x1000) // documentation 3fff::/20
}
