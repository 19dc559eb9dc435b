//! The console in a real browser (Debian's chromium through chromedriver), against the real
//! binary: a wrong token refused, sign-in, a session that appears when a client initializes
//! and leaves when it ends, a plugin disabled from the console and a connected client's tool
//! list changing, a plugin added through its form, a call's audit record and the filter, the
//! live plots. A screenshot of each view is written
//! to `target/tmp/console-screenshots/`, and each is checked for size, visible content and the
//! stylesheet having applied.

mod common;

use common::admin::ADMIN_TOKEN;
use common::browser::Browserdriver;
use common::{Events, FIXTURE, Gateway, tool_names};
use serde_json::json;

/// Writes the page as `name.png` and checks it is a real, full, styled page.
async fn screenshot(b: &Browserdriver, name: &str) {
    let png = b.screenshot().await;
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.png")), &png).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}: a PNG");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert!(width >= 1200 && height >= 800, "{name}: {width}x{height}");
    // A blank or flat page compresses to almost nothing; a drawn one does not.
    assert!(png.len() > 15_000, "{name}: only {} bytes", png.len());
    // The stylesheet applied (the sign-in page's backdrop, or the console's top bar), and
    // the page shows text.
    let styled = b
        .eval(
            "const e = document.querySelector('header.top') || document.body; \
             return getComputedStyle(e).backgroundColor + ' ' + getComputedStyle(e).backgroundImage",
        )
        .await;
    let styled = styled.as_str().unwrap().to_owned();
    assert!(
        styled.contains("rgb(22, 27, 46)") || styled.contains("radial-gradient"),
        "{name}: unstyled ({styled})"
    );
    let text = b.eval("return document.body.innerText").await;
    assert!(text.as_str().unwrap().trim().len() > 40, "{name}: {text}");
}

#[tokio::test]
async fn an_operator_signs_in_and_watches_sessions_plugins_calls_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::write_config(
        &dir,
        &format!(
            "[plugins.alpha]\ncommand = \"{FIXTURE}\"\n[plugins.beta]\ncommand = \"{FIXTURE}\"\n\
             [plugins.gamma]\ncommand = \"{FIXTURE}\"\n"
        ),
    );
    let gw = Gateway::start(&["--admin-token", ADMIN_TOKEN, "--config", &config]);
    let ui = format!("http://{}/ui", gw.admin.clone().unwrap());
    let b = Browserdriver::start().await;
    b.window(1400, 1000).await;

    // A wrong token is refused, and says so.
    b.goto(&ui).await;
    b.type_into("#token", "not-the-token").await;
    b.click("#signin").await;
    b.wait_js(
        "document.querySelector('.error') && document.querySelector('.error').innerText.includes('Wrong token')",
        10,
    )
    .await;
    screenshot(&b, "sign-in-refused").await;

    // Signed in: the overview.
    b.type_into("#token", ADMIN_TOKEN).await;
    b.click("#signin").await;
    b.wait_js(
        "document.getElementById('stat-sessions').textContent === '0'",
        10,
    )
    .await;

    // A client initializes: its session appears, with its client's name.
    let mut c = gw.client();
    c.initialize().await;
    let prefix = c.session.as_deref().unwrap()[..8].to_owned();
    b.eval("location.hash = '#sessions'").await;
    let row = format!("document.querySelector('tr[data-session=\"{prefix}\"]')");
    b.wait_js(
        &format!("{row} && {row}.innerText.includes('gateway-tests 1')"),
        10,
    )
    .await;
    let mut get = Events::new(c.get_stream().await);
    b.wait_js(&format!("{row}.cells[5].innerText === '1'"), 10)
        .await;
    screenshot(&b, "sessions").await;

    // Disable a plugin in the console: the connected client hears its list changed (three
    // plugins, so the two left keep their prefixes).
    let before = c.result(2, "tools/list", json!({})).await;
    assert!(tool_names(&before).contains(&"beta__echo"));
    b.eval("location.hash = '#plugins'").await;
    let beta = "document.querySelector('article[data-plugin=\"beta\"]')";
    b.wait_js(
        &format!("{beta} && {beta}.querySelector('.badge').innerText === 'ready'"),
        20,
    )
    .await;
    b.click("article[data-plugin=\"beta\"] button[data-action=\"disable\"]")
        .await;
    let changed = get.next().await.unwrap();
    assert_eq!(changed["method"], "notifications/tools/list_changed");
    let after = c.result(3, "tools/list", json!({})).await;
    let names = tool_names(&after);
    assert!(!names.iter().any(|n| n.starts_with("beta__")), "{names:?}");
    assert!(names.contains(&"alpha__echo"));
    b.wait_js(
        &format!("{beta}.querySelector('.badge').innerText === 'disabled'"),
        10,
    )
    .await;

    // Add a plugin through the form: a name taken is refused with the admin API's message,
    // a new one appears and becomes ready.
    let add = |name: &'static str| {
        let b = &b;
        async move {
            b.click("#plugin-add").await;
            b.type_into("#plugin-name", name).await;
            b.eval(&format!(
                "document.getElementById('plugin-definition').value = '{{\"command\": \"{FIXTURE}\"}}'; return 1"
            ))
            .await;
            b.click("#plugin-save").await;
        }
    };
    add("alpha").await;
    b.wait_js(
        "!document.getElementById('plugin-error').hidden && \
         document.getElementById('plugin-error').innerText.includes('exists')",
        10,
    )
    .await;
    b.click("#plugin-cancel").await;
    add("delta").await;
    let delta = "document.querySelector('article[data-plugin=\"delta\"]')";
    b.wait_js(
        &format!("{delta} && {delta}.querySelector('.badge').innerText === 'ready'"),
        20,
    )
    .await;

    // A call: its audit record, beside the console's own action.
    assert_eq!(
        c.tool_text(4, "alpha__echo", json!({"text": "hello"}))
            .await,
        "hello"
    );
    for i in 0..20 {
        c.tool_text(10 + i, "alpha__echo", json!({"text": "more"}))
            .await;
    }
    // The plugin's latency plot has points once two samples saw calls.
    b.wait_js(
        "Number(document.querySelector('article[data-plugin=\"alpha\"] canvas.plot-latency').dataset.points) > 0",
        20,
    )
    .await;
    screenshot(&b, "plugins").await;
    b.eval("location.hash = '#audit'").await;
    b.wait_js(
        &format!(
            "[...document.querySelectorAll('#audit-table tbody tr')].some(r => \
             r.cells[6].innerText === 'alpha__echo' && r.cells[7].innerText.startsWith('ok') \
             && r.cells[3].innerText === '{prefix}')"
        ),
        10,
    )
    .await;
    b.wait_js(
        "[...document.querySelectorAll('#audit-table tbody tr')].some(r => \
         r.cells[6].innerText === 'plugin.disable' && r.cells[2].innerText === 'console')",
        10,
    )
    .await;
    // Filtered by action: only the plugin's addition.
    b.type_into("#audit-filter input[name=\"tool\"]", "plugin.add")
        .await;
    b.click("#audit-filter button[type=\"submit\"]").await;
    b.wait_js(
        "(() => { const rows = [...document.querySelectorAll('#audit-table tbody tr')]; \
         return rows.length === 2 && rows.every(r => r.cells[6].innerText === 'plugin.add'); })()",
        10,
    )
    .await;
    b.eval("document.querySelector('#audit-filter').reset(); return 1")
        .await;
    b.click("#audit-filter button[type=\"submit\"]").await;
    // The arguments are shown only as their hash.
    let text = b.eval("return document.body.innerText").await;
    assert!(!text.as_str().unwrap().contains("hello"));
    screenshot(&b, "audit").await;

    // The overview plots the calls.
    b.eval("location.hash = '#overview'").await;
    b.wait_js(
        "Number(document.getElementById('plot-calls').dataset.points) > 0 && \
         Number(document.getElementById('plot-latency').dataset.points) > 0",
        20,
    )
    .await;
    screenshot(&b, "overview").await;

    // The session ends: it leaves the sessions view.
    assert_eq!(c.delete().await, 200);
    b.eval("location.hash = '#sessions'").await;
    b.wait_js(&format!("{row} === null"), 10).await;
    b.wait_js("!document.getElementById('sessions-empty').hidden", 10)
        .await;
}
