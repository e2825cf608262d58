// Talking to the server from the pages: the API key (kept in localStorage, asked for when the
// server answers 401), fetch with the key, and readable messages for the server's errors.

const KEY_STORAGE = 'deepharness.apiKey';

export function apiKey() {
  return localStorage.getItem(KEY_STORAGE) || '';
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY_STORAGE, key);
  else localStorage.removeItem(KEY_STORAGE);
}

export function apiFetch(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const key = apiKey();
  if (key) headers.set('Authorization', 'Bearer ' + key);
  return fetch(path, { ...options, headers, cache: 'no-store' });
}

// Shows the key dialog (a <dialog id="key-dialog"> with a form, an input and a message line)
// and resolves with the key entered, or '' when cancelled.
export function askForKey(reason) {
  const dialog = document.getElementById('key-dialog');
  const input = dialog.querySelector('input');
  const form = dialog.querySelector('form');
  dialog.querySelector('.key-reason').textContent = reason || '';
  input.value = apiKey();
  return new Promise((resolve) => {
    const done = (key) => {
      form.removeEventListener('submit', onSubmit);
      dialog.removeEventListener('cancel', onCancel);
      dialog.close();
      resolve(key);
    };
    const onSubmit = (e) => {
      e.preventDefault();
      setApiKey(input.value.trim());
      done(input.value.trim());
    };
    const onCancel = () => done('');
    form.addEventListener('submit', onSubmit);
    dialog.addEventListener('cancel', onCancel);
    dialog.querySelector('.key-cancel').onclick = () => done('');
    dialog.showModal();
    input.focus();
  });
}

// A sentence for a failed response (status + OpenAI error body).
export async function describeError(res) {
  let body = null;
  try {
    body = await res.json();
  } catch (_) { /* not JSON */ }
  const err = body && body.error ? body.error : {};
  const code = err.code || '';
  if (res.status === 503 && code === 'server_shutting_down')
    return 'The server is shutting down (draining in-flight requests); it is not taking new ones. Try again once it is back.';
  if (res.status === 503 && code === 'server_overloaded')
    return 'The server\'s request queue is full. Wait a moment and try again.';
  if (res.status === 503 && code === 'server_loading')
    return 'The server is still loading the model. Try again in a moment.';
  if (res.status === 429)
    return 'Too many requests: the server\'s queue is full. Wait a moment and try again.';
  if (res.status === 401) return 'The API key is missing or wrong.';
  const message = typeof err.message === 'string' ? err.message : res.statusText;
  return `Error ${res.status}: ${message}`;
}
