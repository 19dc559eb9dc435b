//! The rules for a client's redirect URIs, shared by registration (RFC 7591), client ID
//! metadata documents ([`super::cimd`]) and the authorization endpoint: https, or http on a
//! loopback host (native apps), never a fragment. Pure checks on a URL: this module never
//! looks a client up and never answers a request.

/// Redirect URIs the server accepts: https, or http on a loopback host (native apps), no
/// fragment.
pub fn valid_redirect_uri(uri: &str) -> Result<(), String> {
    let u = url::Url::parse(uri).map_err(|e| format!("redirect URI `{uri}`: {e}"))?;
    if u.fragment().is_some() {
        return Err(format!("redirect URI `{uri}` has a fragment"));
    }
    match u.scheme() {
        "https" if u.host().is_some() => Ok(()),
        "http" if is_loopback_host(&u) => Ok(()),
        _ => Err(format!(
            "redirect URI `{uri}` must be https, or http on a loopback address"
        )),
    }
}

/// Whether a URL's host is `localhost` or a loopback address.
pub fn is_loopback_host(u: &url::Url) -> bool {
    match u.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}
