// A small markdown subset rendered into DOM nodes: paragraphs, fenced code blocks, inline code,
// bold, italic, headings and lists. Model text only ever reaches the page through text nodes
// (createTextNode / textContent); nothing here parses HTML, so "<script>" stays text.

const FENCE = /^\s*(`{3,}|~{3,})\s*([\w+#.-]*)\s*$/;
const LIST_ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const HEADING = /^(#{1,6})\s+(.*)$/;

// Inline spans: `code`, **bold** / __bold__, *italic* / _italic_ (underscores only at word
// boundaries, so snake_case stays as it is).
const INLINE = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*(?=\S)([\s\S]*?\S)\*\*|(?<!\w)__(?=\S)([\s\S]*?\S)__(?!\w)|\*(?=[^\s*])([\s\S]*?[^\s*])\*|(?<!\w)_(?=[^\s_])([\s\S]*?[^\s_])_(?!\w)/g;

function appendText(parent, text) {
  const parts = text.split('\n');
  parts.forEach((part, i) => {
    if (i > 0) parent.appendChild(document.createElement('br'));
    if (part) parent.appendChild(document.createTextNode(part));
  });
}

export function renderInline(text, parent) {
  let last = 0;
  const re = new RegExp(INLINE.source, 'g');  // its own lastIndex: this function recurses
  for (let m; (m = re.exec(text)) !== null;) {
    if (m.index > last) appendText(parent, text.slice(last, m.index));
    let el;
    if (m[1] !== undefined) {
      el = document.createElement('code');
      el.textContent = m[2];
    } else if (m[3] !== undefined || m[4] !== undefined) {
      el = document.createElement('strong');
      renderInline(m[3] ?? m[4], el);
    } else {
      el = document.createElement('em');
      renderInline(m[5] ?? m[6], el);
    }
    parent.appendChild(el);
    last = m.index + m[0].length;
  }
  if (last < text.length) appendText(parent, text.slice(last));
}

// Returns a DocumentFragment for `text`. An unclosed code fence (a reply still streaming) is
// shown as a code block up to the end of the text.
export function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, '\n').split('\n');
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = FENCE.exec(line);
    if (fence) {
      const marker = fence[1];
      const body = [];
      i++;
      while (i < lines.length && !(lines[i].trim().startsWith(marker) && lines[i].trim().replace(/[`~]/g, '') === '')) {
        body.push(lines[i]);
        i++;
      }
      i++;  // the closing fence
      const pre = document.createElement('pre');
      const code = document.createElement('code');
      if (fence[2]) code.dataset.lang = fence[2];
      code.textContent = body.join('\n');
      pre.appendChild(code);
      out.appendChild(pre);
      continue;
    }
    if (line.trim() === '') {
      i++;
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      const h = document.createElement('h' + Math.min(6, heading[1].length + 2));
      renderInline(heading[2], h);
      out.appendChild(h);
      i++;
      continue;
    }
    const item = LIST_ITEM.exec(line);
    if (item) {
      const ordered = /\d/.test(item[2][0]);
      const list = document.createElement(ordered ? 'ol' : 'ul');
      if (ordered && parseInt(item[2], 10) !== 1) list.start = parseInt(item[2], 10);
      let li = null;
      while (i < lines.length) {
        const m = LIST_ITEM.exec(lines[i]);
        if (m && /\d/.test(m[2][0]) === ordered) {
          li = document.createElement('li');
          renderInline(m[3], li);
          list.appendChild(li);
        } else if (li && lines[i].trim() !== '' && /^\s+/.test(lines[i]) && !FENCE.test(lines[i])) {
          appendText(li, '\n');
          renderInline(lines[i].trim(), li);  // a continuation line of the item
        } else {
          break;
        }
        i++;
      }
      out.appendChild(list);
      continue;
    }
    const para = [];
    while (i < lines.length && lines[i].trim() !== '' && !FENCE.test(lines[i]) &&
           !HEADING.test(lines[i]) && !LIST_ITEM.test(lines[i])) {
      para.push(lines[i]);
      i++;
    }
    const p = document.createElement('p');
    renderInline(para.join('\n'), p);
    out.appendChild(p);
  }
  return out;
}
